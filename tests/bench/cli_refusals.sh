#!/usr/bin/env bash
# spillway-bench refuses bad input before any work: each case below must exit non-zero, print
# nothing on stdout (no table header, no first row) and say on stderr what was wrong.
set -u
bench=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/folder"
failed=0
check() {  # check EXPECTED-STDERR-TEXT ARGS...
  local want=$1
  shift
  "$bench" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "FAIL: spillway-bench $*: exit status 0"
    failed=1
  elif [ -s "$tmp/out" ]; then
    echo "FAIL: spillway-bench $*: work started before the refusal:"
    head -3 "$tmp/out"
    failed=1
  elif ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL: spillway-bench $*: stderr does not say '$want':"
    cat "$tmp/err"
    failed=1
  else
    echo "ok: spillway-bench $*"
  fi
}
check '--network: cannot use "fast"' plan --model gpt2-small --ranks 3 --network fast
check "unknown policy 'bogus'" plan --model zoo --policy lms bogus
check "unknown hardware profile 'nope'" plan --model gpt2-small --hw h200 nope
check "is a folder; give a trace JSON file" plan --trace "$tmp/folder"
check "it is a folder; give a file name in it" plan --model gpt2-small --json "$tmp/folder"
check "give an image side (--seq) of at least 32" plan --model vgg16 --seq 8
check "--budget-ratio: cannot use 0" plan --model gpt2-small --budget-ratio 0
check "--steps: 1 leaves no step after the recording one" train --example gpt --steps 1
check "unknown hardware profile 'nope'" bound --hw nope
# Counts: 0 or a negative count (which CLI11 would make the largest unsigned value and start
# on) is refused with the range the option takes.
check '--iterations: cannot use "0": give a whole number from 1' replay --model resnet50 --iterations 0
check '--ops: cannot use "-5": give a whole number from 1' bound --ops -5
check '--waits: cannot use "-1": give a whole number from 0' plan --model gpt2-small --waits -1
check '--seed: cannot use "-1": give a whole number from 0' train --example gpt --seed -1
check '--repeats: cannot use "0.5": give a whole number from 1' tiers --repeats 0.5
exit $failed
