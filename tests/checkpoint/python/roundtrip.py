#!/usr/bin/env python3
"""zshard checkpoints against Python's safetensors and numpy (from PyPI; .ci/run installs them
into a venv). Exits 77 (ctest: skipped) with a message when they are not installed.

  roundtrip.py BRIDGE WORKDIR

1. export: the engine's consolidated files, read with safetensors.numpy, equal the engine's
   gathered parameters (f32 exactly; bf16 as the round-to-nearest-even of them).
2. load: a model written by safetensors (two files and an index, F32 and F16 tensors) loads
   into a 3-rank engine; every parameter equals the file's values.
3. torch layout: the example GPT's export holds every linear weight as (out, in), so that
   x @ W.T + b with numpy equals the layer's output computed by the model's own code; and a
   file Python writes in that layout loads into the model (as --init-from does) to the same
   effect.
"""
import json
import os
import subprocess
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover
    print(f"skipped: Python modules missing ({e}); run .ci/run or: python3 -m venv build/pyenv && "
          "build/pyenv/bin/pip install safetensors numpy")
    sys.exit(77)


def bf16_bits_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_rne(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return bf16_bits_to_f32(u.astype(np.uint16))


def read_bf16_file(path):
    """numpy has no bfloat16: read the safetensors layout by hand (header, then raw bits)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "BF16", t
        b, e = t["data_offsets"]
        out[name] = bf16_bits_to_f32(np.frombuffer(data[b:e], dtype=np.uint16)).reshape(t["shape"])
    return out


def check_export(bridge, work):
    subprocess.run([bridge, "export", work], check=True)
    gathered = json.load(open(os.path.join(work, "gathered.json")))
    f32 = load_file(os.path.join(work, "export_f32.safetensors"))
    bf16 = read_bf16_file(os.path.join(work, "export_bf16.safetensors"))
    assert set(f32) == set(gathered) == set(bf16), (sorted(f32), sorted(gathered))
    for name, v in gathered.items():
        want = np.array(v["working"], dtype=np.float32)
        got = f32[name]
        assert got.dtype == np.float32 and got.size == want.size, name
        assert np.array_equal(got.reshape(-1), want), f"{name}: f32 export differs from the gathered parameter"
        assert np.array_equal(bf16[name].reshape(-1), f32_to_bf16_rne(want)), f"{name}: bf16 export is not RNE"
    print(f"export: {len(gathered)} tensors equal the engine's gathered parameters (f32 exact, bf16 RNE)")


def check_load(bridge, work):
    rng = np.random.default_rng(1234)
    shapes = {"E": (13, 8), "c": (13,), "s0": (8,)}
    for l in range(3):
        shapes[f"W{l}"] = (8, 8)
        shapes[f"b{l}"] = (8,)
    tensors = {}
    for i, (name, shape) in enumerate(sorted(shapes.items())):
        dt = np.float16 if i % 2 else np.float32
        tensors["model." + name] = rng.normal(0, 0.3, size=shape).astype(dt)
    names = sorted(tensors)
    half = len(names) // 2
    files = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for fname, ns in files.items():
        save_file({n: tensors[n] for n in ns}, os.path.join(work, fname), metadata={"format": "np"})
        weight_map.update({n: fname for n in ns})
    with open(os.path.join(work, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}, f)
    subprocess.run([bridge, "load", work], check=True)
    loaded = json.load(open(os.path.join(work, "loaded.json")))
    for name, v in loaded.items():
        want = tensors["model." + name].astype(np.float32).reshape(-1)
        assert np.array_equal(np.array(v["working"], dtype=np.float32), want), f"{name}: working differs"
        if "master" in v:
            assert np.array_equal(np.array(v["master"], dtype=np.float32), want), f"{name}: master differs"
    print(f"load: {len(loaded)} parameters written by Python safetensors (index, 2 files, F32/F16) loaded exactly")


def check_linear(name, layer, weights):
    """y = x @ W.T + b for W (out, in) as torch's nn.Linear holds it."""
    n_in, n_out = layer["in"], layer["out"]
    w = weights[name]
    assert w.shape == (n_out, n_in), f"{name}: shape {w.shape}, torch's nn.Linear layout is (out, in) = {(n_out, n_in)}"
    x = np.array(layer["x"], dtype=np.float64).reshape(-1, n_in)
    y = np.array(layer["y"], dtype=np.float64).reshape(-1, n_out)
    want = x @ w.astype(np.float64).T
    if layer["bias"]:
        want = want + weights[layer["bias"]].astype(np.float64)
    # the model computes in f32: agreement to f32 rounding of sums of n_in products
    err = np.max(np.abs(want - y)) / max(1.0, np.max(np.abs(want)))
    assert err < 1e-5, f"{name}: x @ W.T + b differs from the layer's output by {err:.3g}"
    # and the transpose is wrong: a square weight would pass its shape check, not its values
    if n_in == n_out:
        assert np.max(np.abs(x @ w.astype(np.float64) - y)) > 1e-3, f"{name}: also equals x @ W (untransposed)"


def check_torch_layout(bridge, work):
    subprocess.run([bridge, "gpt", work], check=True)
    layers = json.load(open(os.path.join(work, "gpt_layers.json")))
    exported = load_file(os.path.join(work, "gpt.safetensors"))
    for name, layer in layers.items():
        check_linear(name, layer, exported)
    # a file written by Python in torch's layout, other values: loaded as --init-from loads it
    rng = np.random.default_rng(99)
    written = {n: rng.normal(0, 0.2, size=t.shape).astype(np.float32) for n, t in exported.items()}
    save_file(written, os.path.join(work, "gpt_torch.safetensors"), metadata={"format": "pt"})
    subprocess.run([bridge, "gpt-load", work], check=True)
    loaded = json.load(open(os.path.join(work, "gpt_loaded_layers.json")))
    for name, layer in loaded.items():
        check_linear(name, layer, written)
    print(f"torch layout: {len(layers)} linear weights exported as (out, in), x @ W.T + b equals the layer's output; "
          "a file written in that layout loads to the same effect")


def main():
    bridge, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    check_export(bridge, work)
    check_load(bridge, work)
    check_torch_layout(bridge, work)


if __name__ == "__main__":
    main()
