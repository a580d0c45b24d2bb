#!/usr/bin/env bash
# The main job with checkpoints, end to end:
#  1. 6 steps uninterrupted                          -> final_loss A
#  2. 3 steps, saving at step 3; resume to step 6    -> final_loss must equal A exactly, and the
#     resumed run says so; --lr on resume replaces the saved learning rate and says so
#  3. resume on 4 ranks x 1 sequence (the same global batch as 2 x 2): the same batches, so each
#     step's loss equals the uninterrupted run's to rounding (not necessarily bit for bit: the sums group
#     differently), and the run says which; on 3 ranks the global batch changes, and it says that
#  4. --export, zshard_export of the checkpoint: identical files; zshard_export into a directory
#     fails and leaves nothing behind
#  5. --init-from the exported file trains
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
run "$work/straight.log" --steps 6 --export "$work/straight.safetensors" --log-every 1
run "$work/first.log" --steps 3 --save-dir "$work/ckpt" --save-every 3
run "$work/resumed.log" --steps 6 --resume "$work/ckpt" --save-dir "$work/ckpt2" --export "$work/resumed.safetensors"
a=$(last "$work/straight.log"); b=$(last "$work/resumed.log")
echo "uninterrupted: $a   resumed: $b"
[ "$a" = "$b" ] || { echo "resume is not exact"; exit 1; }
cmp "$work/straight.safetensors" "$work/resumed.safetensors" || { echo "exports differ after resume"; exit 1; }
grep -q "resumed from .*step-0000000003 at step 3" "$work/resumed.log"
grep -q "same options and split of the batch: the run continues bit for bit" "$work/resumed.log"
run "$work/new_lr.log" --steps 4 --resume "$work/ckpt" --lr 5
grep -q -- "--lr 5 replaces the saved learning rate 0.01" "$work/new_lr.log" || { cat "$work/new_lr.log"; exit 1; }
# the same global batch (4 sequences) on 4 ranks: the same data, equal to rounding
run "$work/four.log" --ranks 4 --batch 1 --steps 6 --resume "$work/ckpt" --log-every 1
grep -q "the same global batches of 4 sequences, split 4 rank(s) x 1 x 1 instead of 2 rank(s) x 2 x 1" "$work/four.log" ||
  { cat "$work/four.log"; exit 1; }
losses() { grep -o '^step *[0-9]*  loss [0-9.]*' "$1" | awk '{print $2, $4}'; }
join <(losses "$work/straight.log") <(losses "$work/four.log") | awk '
  { n++; d = $2 - $3; if (d < 0) d = -d; if (d > 3e-4) { print "step " $1 ": " $2 " vs " $3; bad = 1 } }
  END { if (n != 3 || bad) { print "resumed on 4 ranks: steps 4..6 differ from the uninterrupted run (" n " compared)"; exit 1 } }'
"$tool" "$work/ckpt2" "$work/tool.safetensors" >/dev/null
cmp "$work/straight.safetensors" "$work/tool.safetensors" || { echo "zshard_export differs from --export"; exit 1; }
if "$tool" "$work/ckpt2" "$work/ckpt2" >"$work/into_dir.log" 2>&1; then echo "an export into a directory was accepted"; exit 1; fi
grep -q "is a directory" "$work/into_dir.log" || { cat "$work/into_dir.log"; exit 1; }
if ls -d "$work"/ckpt2*.tmp 2>/dev/null; then echo "a failed export left its temporary file"; exit 1; fi
"$train" "${small[@]}" --ranks 3 --steps 8 --resume "$work/ckpt" >"$work/reshard.log" 2>&1 || [ $? -eq 1 ]
last "$work/reshard.log" | grep -q '^final_loss: '
grep -q "global batch 6 sequences (3 rank(s) x 2 x 1; saved 4 = 2 rank(s) x 2 x 1)" "$work/reshard.log" ||
  { cat "$work/reshard.log"; exit 1; }
run "$work/init.log" --steps 2 --init-from "$work/straight.safetensors"
grep -q "loaded .* pretrained parameters" "$work/init.log"
if "$train" "${small[@]}" --steps 2 --resume "$work/nowhere" >"$work/bad.log" 2>&1; then echo "a missing checkpoint was accepted"; exit 1; fi
grep -q "no checkpoint at" "$work/bad.log"
echo "main job checkpoints: ok"
