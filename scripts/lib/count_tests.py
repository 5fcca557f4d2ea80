#!/usr/bin/env python3
"""Counts GoogleTest cases from one or more Meson build dirs' test logs.

Reads meson-logs/testlog.junit.xml (one <testcase> per GoogleTest case) and meson-logs/testlog.json
(one entry per test program). A program that failed without reporting any failing case (a crash,
a sanitizer abort, a timeout) counts as one failed case, so nothing that failed goes uncounted.
Prints one line per build dir and, with --total, the closing line 'N passed, N failed, N skipped'.
"""
import json
import os
import sys
import xml.etree.ElementTree as ET


def count(build_dir):
    passed = failed = skipped = 0
    failing_programs = []
    logs = os.path.join(build_dir, "meson-logs")
    cases_failed_by_program = {}
    junit = os.path.join(logs, "testlog.junit.xml")
    if os.path.exists(junit):
        for suite in ET.parse(junit).getroot().iter("testsuite"):
            program = suite.get("name", "").split(" / ")[-1].split(".")[0]
            for case in suite.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed += 1
                    cases_failed_by_program[program] = cases_failed_by_program.get(program, 0) + 1
                    failing_programs.append(f"{program}: {case.get('classname')}.{case.get('name')}")
                elif case.find("skipped") is not None:
                    skipped += 1
                else:
                    passed += 1
    testlog = os.path.join(logs, "testlog.json")
    if os.path.exists(testlog):
        with open(testlog) as f:
            for line in f:
                entry = json.loads(line)
                name = entry.get("name", "").split(" / ")[-1]
                if entry.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL") and cases_failed_by_program.get(name, 0) == 0:
                    failed += 1
                    failing_programs.append(f"{name}: program {entry.get('result')} (exit {entry.get('returncode')})")
    return passed, failed, skipped, failing_programs


def main():
    args = sys.argv[1:]
    total = "--total" in args
    extra = 0
    if "--extra-failures" in args:
        i = args.index("--extra-failures")
        extra = int(args[i + 1])
        del args[i:i + 2]
    dirs = [a for a in args if a != "--total"]
    tp, tf, ts = 0, extra, 0
    for d in dirs:
        p, f, s, failing = count(d)
        tp, tf, ts = tp + p, tf + f, ts + s
        if not total:
            print(f"{os.path.basename(d.rstrip('/'))}: {p} passed, {f} failed, {s} skipped")
            for name in failing:
                print(f"  FAILED {name}")
    if total:
        print(f"{tp} passed, {tf} failed, {ts} skipped")
    return 1 if tf else 0


if __name__ == "__main__":
    sys.exit(main())
