#!/usr/bin/env bash
# What a new user of the main job (02_train_gpt) meets, each a tiny run:
#  1. a DeepSpeed config and explicit options: the options win and each override is printed;
#     train_batch_size contradicting ranks x batch x micro is an error; a config without
#     zero_optimization says zshard runs stage 3
#  2. mics_shard_size (hybrid sharding) runs on thread ranks
#  3. a load error longer than 1 KB arrives whole: its kind, every line, its hint (on thread
#     ranks; and on every MPI process when an MPI launcher is given)
#  4. --steps abc names the flag and the value; --export into a directory fails leaving nothing behind
# Usage: main_job_options.sh TRAIN_GPT WORKDIR [MPIEXEC [FLAGS...]]
set -euo pipefail
train=$1 work=$2
shift 2
mpi=("$@")
rm -rf "$work" && mkdir -p "$work"
tiny=(--ranks 4 --layers 1 --d-model 16 --heads 2 --d-ff 32 --seq 8 --batch 2 --eval-every 0 --log-every 100)
fail() { echo "FAIL: $1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
run() { # run LOG ARGS...: exit 0 or 1 (loss not falling in a few steps) is fine
  local log=$1; shift
  "$train" "${tiny[@]}" "$@" >"$log" 2>&1 || { rc=$?; [ $rc -eq 1 ] || fail "exit $rc" "$log"; }
  tail -n 1 "$log" | grep -q '^final_loss: ' || fail "no final_loss line" "$log"
}
refused() { # refused LOG TEXT ARGS...: exit 2 with TEXT on stderr
  local log=$1 text=$2; shift 2
  if "$train" "${tiny[@]}" "$@" >"$log.out" 2>"$log"; then fail "accepted: $*" "$log.out"; else rc=$?; fi
  [ $rc -eq 2 ] || fail "exit $rc, want 2" "$log"
  grep -qF -- "$text" "$log" || fail "no '$text'" "$log"
}

# 1. the config's values, then the command line's over them
cat >"$work/ds.json" <<'JSON'
{"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "bf16": {"enabled": false},
 "gradient_clipping": 1.0, "train_micro_batch_size_per_gpu": 2, "train_batch_size": 8}
JSON
run "$work/ds.log" --steps 2 --deepspeed-config "$work/ds.json" --lr 1e-9 --bf16 --clip 0
grep -qF -- "--lr 1e-09 (command line) overrides optimizer.params.lr = 0.0003" "$work/ds.log" || fail "lr override" "$work/ds.log"
grep -qF -- "--clip 0 (command line) overrides gradient_clipping = 1" "$work/ds.log" || fail "clip override" "$work/ds.log"
grep -qF -- "--bf16 (command line) overrides bf16.enabled = false" "$work/ds.log" || fail "bf16 override" "$work/ds.log"
grep -qF "bf16 working params" "$work/ds.log" || fail "not bf16" "$work/ds.log"
grep -qF "lr 1e-09, clip 0" "$work/ds.log" || fail "lr/clip not applied" "$work/ds.log"
refused "$work/tbs.log" "train_batch_size = 8 contradicts the run: 2 rank(s) x 2 sequence(s) per micro-batch x 1" \
  --deepspeed-config "$work/ds.json" --ranks 2
echo '{"gradient_clipping": 0.5}' >"$work/no_zero.json"
run "$work/no_zero.log" --steps 1 --deepspeed-config "$work/no_zero.json"
grep -qF "no zero_optimization section: DeepSpeed would run without ZeRO (stage 0); zshard runs ZeRO stage 3" \
  "$work/no_zero.log" || fail "no word about the stage" "$work/no_zero.log"

# 2. hybrid sharding from the config: 2 replicas x shard groups of 2
echo '{"zero_optimization": {"stage": 3, "mics_shard_size": 2}}' >"$work/mics.json"
run "$work/mics.log" --steps 2 --deepspeed-config "$work/mics.json"
grep -qF "hybrid sharding: 2 replicas x shard groups of 2 ranks" "$work/mics.log" || fail "not hybrid" "$work/mics.log"

# 3. a checkpoint of 1 block loaded into 8: 84 differences, several KB of message
run "$work/save.log" --steps 1 --save-dir "$work/ck"
refused "$work/long.log" "missing from the checkpoint: 'block7.mlp.proj.bias' [16]" --steps 3 --resume "$work/ck" --layers 8
[ "$(head -c 53 "$work/long.log")" = "02_train_gpt: zshard: configuration error: checkpoint" ] || fail "kind lost" "$work/long.log"
grep -qF "(how to fix: load a checkpoint of this model, or build the model the checkpoint holds)" "$work/long.log" ||
  fail "hint lost" "$work/long.log"
if LC_ALL=C grep -q $'\x1f' "$work/long.log"; then fail "a separator byte in the message" "$work/long.log"; fi
[ "$(wc -c <"$work/long.log")" -gt 2048 ] || fail "shorter than expected" "$work/long.log"
if ((${#mpi[@]})); then  # every process prints the lowest failing rank's error, whole
  "${mpi[@]}" -n 2 "$train" --mpi "${tiny[@]:2}" --steps 3 --resume "$work/ck" --layers 8 >"$work/mpi.out" 2>"$work/mpi.log" &&
    fail "accepted under MPI" "$work/mpi.log"
  for r in 0 1; do
    grep -qF "zshard: rank $r of 2 failed: zshard: configuration error: checkpoint load from '$work/ck' (rank 0):" \
      "$work/mpi.log" || fail "rank $r: kind or origin lost" "$work/mpi.log"
  done
  [ "$(grep -cF "missing from the checkpoint: 'block7.mlp.proj.bias' [16] (how to fix: load a checkpoint" "$work/mpi.log")" = 2 ] ||
    fail "not whole on both MPI processes" "$work/mpi.log"
fi

# 4. numbers; an export into a directory (refused, nothing left behind)
refused "$work/abc.log" "02_train_gpt: --steps takes a whole number, not 'abc'" --steps abc
mkdir -p "$work/out"
refused "$work/export_dir.log" "--export $work/out: a directory; name the file to write" --steps 1 --export "$work/out"
echo "main job options: ok"
