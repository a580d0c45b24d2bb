#!/usr/bin/env python3
"""Loads a Llama that zshard exported (06_train_llama --export DIR) with transformers and checks
that it reproduces zshard's logits (06_train_llama --logits-out FILE: input_ids and logits of one
held-out batch, computed by zshard on the same weights).

    python tools/hf_reference/check_export.py DIR FILE [--tolerance X]

Both sides compute in f32 from the same weights (06_train_llama reads the exported directory
back before it computes the logits, so they are the exported dtype's values): prints the largest
difference and exits 0 when it is within the tolerance (default 1e-4 of the largest |logit|; the
fixture's comparison, tests/examples/test_llama.cpp, measures 1e-6), 1 when the logits differ,
77 (ctest: skipped) when torch or transformers cannot be imported, 2 on bad input.
"""
import argparse
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:  # ctest reads 77 as "skipped"
    print(f"skipped: {e}")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("logits")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ref = load_file(a.logits)
    ids = ref["input_ids"].long()
    with torch.no_grad():
        got = model(input_ids=ids).logits
    want = ref["logits"]
    if got.shape != want.shape:
        print(f"transformers' logits have shape {tuple(got.shape)}, zshard's {tuple(want.shape)}")
        return 1
    diff = float((got - want).abs().max())
    scale = float(want.abs().max())
    print(f"transformers {transformers.__version__} loaded {a.dir} ({type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters)")
    print(f"logits of {ids.shape[0]} x {ids.shape[1]} tokens: max |transformers - zshard| = {diff:.3e}, "
          f"max |logit| = {scale:.3f}, relative {diff / scale:.3e} (tolerance {a.tolerance:g})")
    print(f"first row, first 5 logits: transformers {got[0, 0, :5].tolist()}")
    print(f"                           zshard       {want[0, 0, :5].tolist()}")
    if diff > a.tolerance * scale:
        print("MISMATCH")
        return 1
    print("match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
