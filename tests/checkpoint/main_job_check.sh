#!/usr/bin/env bash
# The main job with checkpoints, end to end:
#  1. 6 steps uninterrupted                          -> final_loss A
#  2. 3 steps, saving at step 3; resume to step 6    -> final_loss must equal A exactly
#     (and resuming on another rank count still trains)
#  3. --export, zshard_export of the checkpoint: identical files
#  4. --init-from the exported file trains
# Usage: main_job_check.sh TRAIN_GPT ZSHARD_EXPORT WORKDIR
set -euo pipefail
train=$1 tool=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
small=(--ranks 2 --layers 1 --d-model 32 --heads 2 --d-ff 64 --seq 16 --batch 2 --eval-every 0 --log-every 100 --lr 1e-2)
last() { tail -n 1 "$1"; }
run() { # run LOG ARGS...: exit 0 or 1 (loss not falling on a short run) is fine, 2 is an error
  local log=$1; shift
  "$train" "${small[@]}" "$@" >"$log" 2>&1 || { rc=$?; if [ $rc -ne 1 ]; then cat "$log"; exit 1; fi; }
  last "$log" | grep -q '^final_loss: ' || { echo "no final_loss line in $log"; cat "$log"; exit 1; }
}
run "$work/straight.log" --steps 6 --export "$work/straight.safetensors"
run "$work/first.log" --steps 3 --save-dir "$work/ckpt" --save-every 3
run "$work/resumed.log" --steps 6 --resume "$work/ckpt" --save-dir "$work/ckpt2" --export "$work/resumed.safetensors"
a=$(last "$work/straight.log"); b=$(last "$work/resumed.log")
echo "uninterrupted: $a   resumed: $b"
[ "$a" = "$b" ] || { echo "resume is not exact"; exit 1; }
cmp "$work/straight.safetensors" "$work/resumed.safetensors" || { echo "exports differ after resume"; exit 1; }
grep -q "resumed from .*step-0000000003 at step 3" "$work/resumed.log"
"$tool" "$work/ckpt2" "$work/tool.safetensors" >/dev/null
cmp "$work/straight.safetensors" "$work/tool.safetensors" || { echo "zshard_export differs from --export"; exit 1; }
"$train" "${small[@]}" --ranks 3 --steps 8 --resume "$work/ckpt" >"$work/reshard.log" 2>&1 || [ $? -eq 1 ]
last "$work/reshard.log" | grep -q '^final_loss: '
run "$work/init.log" --steps 2 --init-from "$work/straight.safetensors"
grep -q "loaded .* pretrained parameters" "$work/init.log"
if "$train" "${small[@]}" --steps 2 --resume "$work/nowhere" >"$work/bad.log" 2>&1; then echo "a missing checkpoint was accepted"; exit 1; fi
grep -q "no checkpoint at" "$work/bad.log"
echo "main job checkpoints: ok"
