#!/usr/bin/env python3
"""PyTorch reference for bench_gpu's GPT stage (bench/gpu/gpt_stage.hpp): the same GPT, timed on
the same GPU in the same run.sh call, so that `gpu_gpt_vs_pytorch_eager` is a measurement and
not a ratio to a figure from another machine.

The model is the example's (examples/gpt/gpt_config.hpp, gpt_modules.hpp): token and position
embeddings, pre-norm blocks (layer norm, fused qkv projection with bias, causal attention, output
projection, layer norm, fc, GELU with the tanh approximation, projection), a final layer norm and
an untied head without bias; the loss is the mean softmax cross-entropy. The training step is
what a PyTorch user writes: bf16 autocast, F.scaled_dot_product_attention(is_causal=True),
global-norm clipping at 1.0 and fused AdamW (weight decay 0.1 on the weights only, as the
example's spec). The batch is random tokens on the device, as the bench's synthetic corpus.

  python3 bench/gpu/torch_reference.py --mode eager|compile [--steps N] [--warmup N] [shape]

Prints `name: value` lines: the device, the shape (bench_gpu checks both against its own before
it prints a ratio), then torch_<mode>_ms_per_step, torch_<mode>_tokens_per_s and the peak memory.
Exit status: 0 when it timed its steps, 2 when it cannot run here (no CUDA device for torch),
1 on any other failure. The library never needs Python; only run.sh calls this.
"""
import argparse
import math
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--device", default="cuda", help="cuda (the bench), or cpu to check this script without a GPU")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-ff", type=int, default=3072)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (torch.compile compiles in the first)")
    return p.parse_args()


def main():
    a = parse()
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # run.sh checks `import torch` first; this is for direct use
        print(f"torch_reference: cannot import torch: {e}")
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_reference: torch {torch.__version__} sees no CUDA device (a CPU-only build?)")
        return 2
    if a.d_model % a.heads:
        print("torch_reference: --d-model must be a multiple of --heads")
        return 1
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"torch_device: {name}")
    print(f"torch_version: {torch.__version__}")
    print(f"torch_shape: vocab {a.vocab} seq {a.seq} d_model {a.d_model} heads {a.heads} layers {a.layers} "
          f"d_ff {a.d_ff} batch {a.batch}")
    sys.stdout.flush()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = a.d_model
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.mlp_proj = nn.Linear(d, a.d_ff), nn.Linear(a.d_ff, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, a.heads, d // a.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(a.vocab, a.d_model), nn.Embedding(a.seq, a.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.d_model)
            self.head = nn.Linear(a.d_model, a.vocab, bias=False)

        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))  # autocast: in f32

    torch.manual_seed(1234)
    model = GPT().to(dev)
    for n, p in model.named_parameters():  # GPT-2's initialisation, as the example's describe()
        if p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * a.layers) if n.endswith("proj.weight") else 0.02
            torch.nn.init.normal_(p, 0.0, std)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = {"fused": True}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, **fused)
    step_fn = model
    if a.mode == "compile":
        step_fn = torch.compile(model)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)

    def step():
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = step_fn(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    t0 = time.perf_counter()
    for i in range(a.warmup):
        loss = step()
        if i == 0:
            sync()
            print(f"torch_{a.mode}_first_step_s: {time.perf_counter() - t0:.1f}")  # compile time with --mode compile
            sys.stdout.flush()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t1 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - t1
    ms = 1e3 * seconds / a.steps
    print(f"torch_{a.mode}_ms_per_step: {ms:.2f}")
    print(f"torch_{a.mode}_tokens_per_s: {a.batch * a.seq * a.steps / seconds:.0f}")
    if dev.type == "cuda":
        print(f"torch_{a.mode}_peak_gib: {torch.cuda.max_memory_allocated(dev) / 2**30:.2f}")
    print(f"torch_{a.mode}_loss_end: {float(loss):.4f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a failure after torch started: loud, and not "cannot run here"
        import traceback
        traceback.print_exc()
        print(f"torch_reference: failed: {e}")
        sys.exit(1)
