#!/usr/bin/env bash
# transformers loads what the Llama main job exports and reproduces zshard's logits: the fixture
# fine-tuned for 3 steps on 3 thread ranks, exported (bf16, sharded), and the logits of a held-out
# batch that zshard computed on the exported weights compared with transformers' on the same
# files (tools/hf_reference/check_export.py). Exit 77 (skipped) when PYTHON cannot import torch
# and transformers, as on CI.
# Usage: llama_transformers.sh TRAIN_LLAMA PYTHON FIXTURE_DIR CHECK_SCRIPT WORKDIR
set -euo pipefail
train=$1 python=$2 fixture=$3 check=$4 work=$5
if ! "$python" -c "import torch, transformers" >/dev/null 2>&1; then
  echo "skipped: $python cannot import torch and transformers (tools/hf_reference/make_llama_fixture.py says how to install them)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
"$train" --init-from "$fixture" --ranks 3 --steps 3 --batch 2 --seq 16 --max-shard-size 64KB \
  --export "$work/out" --logits-out "$work/logits.safetensors"
"$python" "$check" "$work/out" "$work/logits.safetensors"
