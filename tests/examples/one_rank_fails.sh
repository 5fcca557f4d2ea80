#!/usr/bin/env bash
# A data-parallel job where one rank fails before its first collective ends at once, with that
# rank's status: the program's error handler ends the whole job (end_data_parallel_job), so no
# rank waits out the collectives' timeout for it. Here rank 1's checkpoint folder is missing.
set -u
mpirun=$1
program=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
run() { "$mpirun" -np 2 --oversubscribe "$program" --backend cpu --preset tiny --data-parallel "$@"; }
if ! run --steps 2 --save ck >save.log 2>&1; then
  echo "FAIL: the two-rank run that saves failed:"
  cat save.log
  exit 1
fi
rm -rf ck/rank-1-of-2
start=$(date +%s)
timeout 60 "$mpirun" -np 2 --oversubscribe "$program" --backend cpu --preset tiny --data-parallel --steps 4 \
  --resume ck >resume.log 2>&1
rc=$?
took=$(($(date +%s) - start))
if [ "$rc" -eq 124 ]; then
  echo "FAIL: the job still ran 60 s after rank 1 failed"
  tail -5 resume.log
  exit 1
fi
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the job resumed without rank 1's checkpoint and exited 0"
  exit 1
fi
if ! grep -q "no checkpoint for rank 1 of 2 ranks" resume.log; then
  echo "FAIL: rank 1 did not say why it failed:"
  cat resume.log
  exit 1
fi
# The collectives' timeout is 120 s; ending the job takes well under that.
if [ "$took" -gt 30 ]; then
  echo "FAIL: the job took $took s to end after rank 1 failed"
  exit 1
fi
echo "ok: the job ended with status $rc in $took s"
