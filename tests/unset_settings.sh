#!/usr/bin/env bash
# scripts/lib/unset_settings (sourced by scripts/test and scripts/soak) drops every Spillway
# setting the shell holds, naming each, and keeps the tests' seed and other variables.
set -uo pipefail
lib=$1
export SPILLWAY_POLICY=lms SPILLWAY_DEVICE_BUDGET_RATIO=0.5 SPILLWAY_TEST_SEED=7 SPILLWAY_TYPO=1 OTHER_SPILLWAY_X=2
said=$(source "$lib"; env | grep -E '^(SPILLWAY_|OTHER_SPILLWAY_)' | sort > "${TMPDIR:-/tmp}/unset_settings.$$")
left=$(cat "${TMPDIR:-/tmp}/unset_settings.$$")
rm -f "${TMPDIR:-/tmp}/unset_settings.$$"
failed=0
want_left=$'OTHER_SPILLWAY_X=2\nSPILLWAY_TEST_SEED=7'
if [ "$left" != "$want_left" ]; then
  echo "FAIL: left set: $(echo $left), want: $(echo $want_left)"
  failed=1
fi
for v in SPILLWAY_POLICY SPILLWAY_DEVICE_BUDGET_RATIO SPILLWAY_TYPO; do
  if ! grep -q "$v is set in this shell; the tests run without it" <<<"$said"; then
    echo "FAIL: no line names $v: $said"
    failed=1
  fi
done
if grep -q SPILLWAY_TEST_SEED <<<"$said"; then
  echo "FAIL: the seed was named as dropped: $said"
  failed=1
fi
[ "$failed" -eq 0 ] && echo "ok: settings dropped and named, the seed and other variables kept"
exit "$failed"
