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
# Outputs: an output that is an input of the run, or another output of it, is refused before
# any work, and the input is left as it was.
echo '{}' >"$tmp/in.json"
check "--json: '$tmp/in.json' is the --trace file" plan --trace "$tmp/in.json" --json "$tmp/in.json"
check "is also the --json file" plan --model gpt2-small --json "$tmp/r.json" --svg "$tmp/r.json"
check "--chrome-trace: '$tmp/r2.json' is also the --json file ('$tmp/./r2.json')" plan --model gpt2-small --chrome-trace "$tmp/r2.json" --json "$tmp/./r2.json"
echo '{"nvme": {"directories": ["/tmp"]}, "policy": "auto"}' >"$tmp/my.json"
check "--tune-out: '$tmp/my.json' is the --config file" tiers --config "$tmp/my.json" --tune --tune-out "$tmp/my.json"
check "exists and is not a snippet of --tune" tiers --tune --tune-out "$tmp/in.json"
check "--tune-out: only --tune writes a snippet" tiers --tune-out "$tmp/t.json"
check "--json: --ranks prints its table and writes no --json file" plan --model gpt2-small --ranks 2 --json "$tmp/r.json"
if [ "$(cat "$tmp/in.json")" != '{}' ] || ! grep -q '"policy": "auto"' "$tmp/my.json"; then
  echo "FAIL: an input was changed by a refused run"
  failed=1
fi
# Counts and amounts past what a real run asks for are refused with the range, not run.
check '--layers: cannot use "100000000": give a whole number from 2 to 10000' overhead --ops 10 --runs 1 --layers 100000000
check '--layers: cannot use "4000000": give a whole number from 0 to 1000' plan --model gpt2-small --layers 4000000
check '--batch: cannot use "99999999999": give a whole number from 0 to' plan --model gpt2-small --batch 99999999999
check '--steps: cannot use "99999999999": give a whole number from 1 to 100000' train --example gpt --steps 99999999999
check '--target-ms: cannot use "1e9": give a number from 1 to 10000' replay --model gpt2-small --iterations 1 --target-ms 1e9
check '--target-ms: cannot use "0": give a number from 1 to 10000' replay --model gpt2-small --target-ms 0
check '--scale: cannot use "-1": give a number above 0' replay --model gpt2-small --scale -1
check "--scale: cannot use 1e+12: it makes gpt2-small's ideal step" replay --model gpt2-small --scale 1e12
check '--fit-step-ms: cannot use 1e+300: give a step time above 0 and at most 3600000 ms' plan --trace "$tmp/in.json" --fit-step-ms 1e300
check "--layers: 3 is too few for a planned policy at --budget-ratio 0.25" overhead --layers 3
check "--policies: 'bogus' is not a policy" overhead --policies none bogus
check '--target-none-us: cannot use "-1": give a number above 0' overhead --target-none-us -1
check '--target: cannot use "-1": give a number above 0' adam --target -1
check '--target: cannot use "0": give a number above 0' copies --target 0
check '--target-planned-us: cannot use "nan": give a number above 0' overhead --target-planned-us nan
check '--network-latency-us: cannot use "-1": give a number from 0 to 1000000' plan --model gpt2-small --ranks 2 --network-latency-us -1
check "--ranks-per-node: 8 is more than the 4 ranks" plan --model gpt2-small --ranks 4 --ranks-per-node 8
check "--link-share: cannot use 0: give a share" plan --model gpt2-small --ranks 2 --link-share 0
check "--early-step-share: cannot use 2: give a share" plan --model gpt2-small --ranks 2 --early-step-share 2
if "$bench" optimal --help >/dev/null 2>&1; then
  check "--case: 'nomatch' is in no case's name" optimal --case nomatch
  check "--budget-ratio: cannot use -1: give a fraction" optimal --budget-ratio -1
fi
# A write that fails (a full disk) is an error naming the file, not a cut file and exit status 0.
check_failed_write() {  # check_failed_write ARGS...: the run may print its rows, then must fail
  "$bench" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq 0 ] || ! grep -qF "/dev/full: cannot write" "$tmp/err"; then
    echo "FAIL: spillway-bench $*: exit status $rc, stderr:"
    cat "$tmp/err"
    failed=1
  else
    echo "ok: spillway-bench $*"
  fi
}
if [ -w /dev/full ]; then
  check_failed_write plan --model gpt2-small --policy none --budget-ratio 0.5 --json /dev/full
  check_failed_write plan --model gpt2-small --policy none --budget-ratio 0.5 --svg /dev/full
  check_failed_write gpt-shape --preset tiny --json /dev/full
fi
exit $failed
