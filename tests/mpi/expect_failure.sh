#!/usr/bin/env bash
# Runs an MPI job and asserts how it ended, for the failure tests in tests/CMakeLists.txt.
# usage: expect_failure.sh <status: zero|nonzero> <max_seconds> <text> <min_count> <max_count> -- command...
# The job's combined output must contain <text> between <min_count> and <max_count> times
# (a fixed string), it must exit with the given status, and end within <max_seconds>.
set -u
want_status=$1 max_seconds=$2 text=$3 min_count=$4 max_count=$5
shift 5
[ "$1" = "--" ] && shift
start=$(date +%s.%N)
out=$("$@" 2>&1)
status=$?
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
count=$(printf '%s\n' "$out" | grep -cF -- "$text")
printf '%s\n' "$out"
echo "---- expect_failure: status $status, ${elapsed} s, '$text' printed $count time(s)"
ok=1
if [ "$want_status" = zero ] && [ "$status" -ne 0 ]; then echo "FAIL: expected exit status 0"; ok=0; fi
if [ "$want_status" = nonzero ] && [ "$status" -eq 0 ]; then echo "FAIL: expected a non-zero exit status"; ok=0; fi
if awk -v e="$elapsed" -v m="$max_seconds" 'BEGIN { exit !(e > m) }'; then
  echo "FAIL: took ${elapsed} s, more than ${max_seconds} s"; ok=0
fi
if [ "$count" -lt "$min_count" ] || [ "$count" -gt "$max_count" ]; then
  echo "FAIL: '$text' printed $count time(s), expected ${min_count}..${max_count}"; ok=0
fi
[ $ok -eq 1 ] && echo "PASS" && exit 0
exit 1
