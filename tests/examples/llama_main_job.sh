#!/usr/bin/env bash
# The Llama main job (06_train_llama) end to end on the fixture's Hugging Face checkpoint: a
# fine-tune on 3 thread ranks with the prompt masked (the loss falls), an export as a sharded
# Hugging Face directory (index, shards, config), a second run from that export, and bad input
# refused with exit 2 and a message naming it.
# Usage: llama_main_job.sh TRAIN_LLAMA FIXTURE_DIR WORKDIR
set -euo pipefail
train=$1 fixture=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
small=(--batch 2 --seq 16 --log-every 4)

"$train" --init-from "$fixture" --ranks 3 --steps 8 "${small[@]}" --max-shard-size 64KB \
  --export "$work/out" >"$work/train.log" 2>&1 || fail "exit $?" "$work/train.log"
tail -n 1 "$work/train.log" | grep -q '^final_loss: ' || fail "no final_loss line" "$work/train.log"
grep -qF "of which 8 prompt tokens (labels -100)" "$work/train.log" || fail "prompt not masked" "$work/train.log"
read -r first last < <(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\) over 8 step(s).*/\1 \2/p' "$work/train.log")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss not falling: $first -> $last" "$work/train.log"
[ -f "$work/out/config.json" ] && [ -f "$work/out/model.safetensors.index.json" ] || fail "no config or index" "$work/train.log"
shards=$(ls "$work/out" | grep -c '^model-0000[1-9]-of-0000[1-9]\.safetensors$' || true)
[ "$shards" -ge 2 ] || fail "$shards shard(s) in the export" "$work/train.log"
grep -qF '"dtype": "bfloat16"' "$work/out/config.json" || fail "the export's dtype is not the checkpoint's" "$work/out/config.json"

# the export is a checkpoint the job starts from
"$train" --init-from "$work/out" --ranks 2 --steps 2 "${small[@]}" >"$work/again.log" 2>&1 || fail "exit $?" "$work/again.log"
grep -qF "loaded 21 tensors from the Hugging Face checkpoint $work/out" "$work/again.log" || fail "not loaded" "$work/again.log"

refused() { # refused TEXT ARGS...: exit 2 with TEXT on stderr
  local text=$1; shift
  if "$train" "$@" >"$work/refused.out" 2>"$work/refused.log"; then fail "accepted: $*" "$work/refused.out"; else rc=$?; fi
  [ $rc -eq 2 ] || fail "exit $rc, want 2: $*" "$work/refused.log"
  grep -qF -- "$text" "$work/refused.log" || fail "no '$text' for: $*" "$work/refused.log"
}
refused "leaves no label in a sequence of 16" --init-from "$fixture" --seq 16 --prompt-tokens 16
refused "exists and is not an empty directory" --init-from "$fixture" --export "$work/out"
refused "name the model: --init-from DIR" --steps 2
refused "llama_main_job' holds no config.json" --init-from "$work" "${small[@]}"
cp "$fixture/config.json" "$work/"
refused "holds neither model.safetensors.index.json nor model.safetensors" --init-from "$work" "${small[@]}"
refused "--max-shard-size takes a size such as 64KB" --init-from "$fixture" --max-shard-size 5XB
echo "llama main job: loss $first -> $last, $shards shards exported, read back, bad input refused"
