#!/usr/bin/env python3
"""The C example's invariant (examples/c_loop), as TAP: c_loop_wrapped, the plain C GPT with its
layer calls wrapped in Spillway ops through the C API, prints the same train and eval losses, bit
for bit (%.9g of every float), as c_loop_plain, at the policies none, lms, vdnn, checkpoint (which
runs forward calls again where nothing spills to NVMe) and auto (whose plans may run the AdamW steps
on the host), at device budgets of 1/2 and 1/4
of the footprint (SPILLWAY_DEVICE_BUDGET_RATIO) and the least any plan needs (--least-budget:
spw_least_budget_bytes then spw_set_device_budget), each with and without NVMe spill (a swap
directory and a host tier too small for what leaves the device). The run's summary line must
show the budget kept and bytes moved. With the cpu backend's guard on device memory
(cpu_debug_host_access) the wrapped loop touches it only inside host runs. Settings from a JSON file (--config) work the same; a ratio
below the least is refused with a config error.

Usage: c_loop_invariant.py PLAIN WRAPPED [--subset]   (--subset: policies none and auto only, for
the sanitizer builds)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

STEPS = ["--steps", "8", "--eval-every", "4"]


def clean_env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLWAY_") and not k.startswith("C_LOOP_")}
    env.update({"SPILLWAY_BACKEND": "cpu", "SPILLWAY_CPU_DEVICE_MEMORY": "64MiB"})
    env.update(extra)
    return env


def run(cmd, env):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def summary(stderr):
    m = re.search(r"^summary: (.*)$", stderr, re.M)
    if not m:
        return None
    words = m.group(1).split()
    return {words[i]: float(words[i + 1]) for i in range(0, len(words) - 1, 2)}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    subset = "--subset" in sys.argv
    plain, wrapped = args[0], args[1]
    policies = ["none", "auto"] if subset else ["none", "lms", "vdnn", "checkpoint", "auto"]
    budgets = ["half", "quarter", "least"]
    cases = [(p, b, nvme) for p in policies for b in budgets for nvme in (False, True)]
    total = len(cases) + 6
    print(f"1..{total}", flush=True)
    n = 0
    failed = 0

    def report(ok, name, why=""):
        nonlocal n, failed
        n += 1
        failed += 0 if ok else 1
        print(f"{'ok' if ok else 'not ok'} {n} - {name}", flush=True)
        if why:
            for line in why.strip().splitlines()[-20:]:
                print(f"# {line}", flush=True)

    base = run([plain] + STEPS, clean_env({}))
    losses = base.stdout
    ok = base.returncode == 0 and losses.count("train loss") == 8 and losses.count("eval loss") == 2
    report(ok, "plain run", "" if ok else base.stdout + base.stderr)
    if not ok:
        return 1

    resident = run([wrapped] + STEPS, clean_env({"SPILLWAY_POLICY": "none"}))
    ok = resident.returncode == 0 and resident.stdout == losses
    report(ok, "wrapped, everything resident", "" if ok else f"plain:\n{losses}wrapped:\n{resident.stdout}{resident.stderr}")
    full = summary(resident.stderr)

    tmp = tempfile.mkdtemp(prefix="c_loop_nvme_")
    try:
        for policy, budget, nvme in cases:
            name = f"policy {policy}, budget {budget}" + (", NVMe spill" if nvme else "")
            extra = {"SPILLWAY_POLICY": policy}
            flags = []
            if budget == "least":
                flags = ["--least-budget"]
            else:
                extra["SPILLWAY_DEVICE_BUDGET_RATIO"] = "0.5" if budget == "half" else "0.25"
            if nvme:
                extra.update({"SPILLWAY_NVME_DIRECTORIES": tmp, "SPILLWAY_HOST_BUDGET": "128KiB"})
            r = run([wrapped] + STEPS + flags, clean_env(extra))
            s = summary(r.stderr)
            problems = []
            if r.returncode != 0:
                problems.append(f"exit {r.returncode}: {r.stderr}")
            elif r.stdout != losses:
                problems.append(f"losses differ\nplain:\n{losses}wrapped:\n{r.stdout}")
            elif s is None:
                problems.append("no summary line: " + r.stderr)
            else:
                if budget == "least" and s["budget"] != s["least"]:
                    problems.append(f"budget {s['budget']:.0f} is not the least {s['least']:.0f}")
                want = s["footprint"] * (0.5 if budget == "half" else 0.25)
                if budget != "least" and abs(s["budget"] - want) > 512:
                    problems.append(f"budget {s['budget']:.0f} is not the ratio of the footprint {s['footprint']:.0f}")
                if s["peak"] > s["budget"]:
                    problems.append(f"peak {s['peak']:.0f} above the budget {s['budget']:.0f}")
                if s["h2d"] + s["d2h"] == 0:
                    problems.append("nothing moved below the footprint")
                if nvme and s["nvme_write"] == 0:
                    problems.append("nothing spilled to NVMe under a host tier of 128 KiB")
                if policy == "checkpoint" and budget != "least" and not nvme and s["recomputes"] == 0:
                    problems.append("checkpoint ran no forward call again")
                if policy == "none" and s["recomputes"] + s["host_ops"] > 0:
                    problems.append("policy none recomputed or ran an op on the host")
            report(not problems, name, "\n".join(problems))

        r = run([wrapped] + STEPS, clean_env({"SPILLWAY_POLICY": "auto", "SPILLWAY_DEVICE_BUDGET_RATIO": "0.25",
                                              "SPILLWAY_CPU_DEBUG_HOST_ACCESS": "true"}))
        ok = r.returncode == 0 and r.stdout == losses
        report(ok, "device memory guarded outside host runs (cpu_debug_host_access): no stray access",
               "" if ok else f"exit {r.returncode}: {r.stdout}{r.stderr}")

        config = os.path.join(tmp, "session.json")
        with open(config, "w") as f:
            f.write('{"backend": "cpu", "cpu_device_memory": "64MiB", "policy": "lms", "device_budget_ratio": 0.25}')
        r = run([wrapped] + STEPS + ["--config", config], {k: v for k, v in clean_env({}).items() if not k.startswith("SPILLWAY_")})
        s = summary(r.stderr)
        ok = r.returncode == 0 and r.stdout == losses and s is not None and abs(s["budget"] - s["footprint"] / 4) <= 512
        report(ok, "settings from a JSON file (--config): lms at 1/4", "" if ok else f"exit {r.returncode}: {r.stdout}{r.stderr}")

        refused = run([wrapped] + STEPS, clean_env({"SPILLWAY_DEVICE_BUDGET_RATIO": "0.001"}))
        ok = refused.returncode == 1 and "config error" in refused.stderr and "SPILLWAY_DEVICE_BUDGET_RATIO" in refused.stderr
        report(ok, "a ratio below the least is refused as a config error",
               "" if ok else f"exit {refused.returncode}: {refused.stderr}")

        bad = [([plain, "--steps", "abc"], "--steps is 'abc'"), ([wrapped, "--steps", "-5"], "--steps is '-5'"),
               ([wrapped, "--stesp", "1"], "unknown argument '--stesp'"), ([plain, "--eval-every"], "needs a value")]
        outs = [(run(cmd, clean_env({})), want) for cmd, want in bad]
        ok = all(r.returncode == 2 and want in r.stderr and "train loss" not in r.stdout for r, want in outs)
        report(ok, "a bad or unknown argument is refused before any step",
               "" if ok else "\n".join(f"exit {r.returncode}: {r.stdout}{r.stderr}" for r, _ in outs))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if full is None:
        report(False, "summary of the resident run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
