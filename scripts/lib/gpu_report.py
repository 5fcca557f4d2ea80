#!/usr/bin/env python3
"""The verdict of bench/gpu_check: reads what its steps left in OUT and writes OUT/report.json
(every figure), OUT/meson-logs/testlog.junit.xml (one case per step and per target, so
scripts/lib/count_tests.py counts them), and prints one line per target: PASS, MISS or SKIP with
the figures. Exit status 0 when the run passed (a dry run: when every step ran and the losses
matched; its speed targets are informational), else 1.
"""
import argparse
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

SPEED_TARGET = 0.7   # Spillway at 1/4 of the footprint: at least this x its everything-resident throughput
COPY_TARGET = 0.9    # pinned copies: at least this x a plain cudaMemcpyAsync loop
NVME_TARGET = 0.9    # NVMe tier: at least this x a plain liburing loop
CUDA_NAME = re.compile(r"cuda|gpu", re.IGNORECASE)


def size(n):
    """Bytes as the programs print them: 512 KiB, 1.5 GiB."""
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1024


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_lines(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    return rows


def why_missing(out, steps, name):
    """Why a step left no figures: HANG, out of time, or its exit status and last line of output."""
    s = next((x for x in steps if x["name"] == name), None)
    if s is None:
        return "not run"
    if s["status"] == "hang":
        return f"HANG ({s.get('reason', '')})"
    if s["status"] == "skip":
        return s.get("reason", "skipped")
    last = ""
    try:
        with open(os.path.join(out, "logs", name + ".txt")) as f:
            lines = [l.strip() for l in f if l.strip()]
        last = lines[-1][:160] if lines else ""
    except OSError:
        pass
    return f"{s.get('reason') or s['status']}: {last}" if last else (s.get("reason") or s["status"])


class Verdict:
    def __init__(self, dry):
        self.dry = dry
        self.lines = []  # dicts: target, result, detail, figures, informational

    def add(self, target, result, detail, figures=None, informational=False):
        self.lines.append({"target": target, "result": result, "detail": detail, "figures": figures or {},
                           "informational": informational})

    def speed(self, target, ok, detail, figures):
        """A speed target: PASS/MISS; in a dry run it is informational (a loaded 2-core machine)."""
        self.add(target, "PASS" if ok else "MISS", detail, figures, informational=self.dry)

    def failed(self):
        return [v for v in self.lines if v["result"] in ("MISS", "FAIL", "HANG") and not v["informational"]]


def tests_section(out, bundle, steps, v, dry):
    programs = load(os.path.join(bundle, "tests.json")) or []
    passed = failed = skipped = 0
    skips, failures, cuda_skips = [], [], []
    per_program = []
    by_step = {s["name"]: s for s in steps}
    for t in programs:
        name = t["name"]
        s = by_step.get("test-" + name, {"status": "missing"})
        j = load(os.path.join(out, "tests", name + ".json"))
        p = f = k = 0
        for suite in (j or {}).get("testsuites", []):
            for case in suite.get("testsuite", []):
                full = f"{suite['name']}.{case['name']}"
                if case.get("status") == "NOTRUN":
                    continue  # DISABLED_ tests: not run, not counted (as GoogleTest's own summary)
                if case.get("result") == "SKIPPED":
                    k += 1
                    skips.append(f"{name}: {full}")
                    if CUDA_NAME.search(full):
                        cuda_skips.append(f"{name}: {full}")
                elif case.get("failures"):
                    f += 1
                    failures.append(f"{name}: {full}")
                else:
                    p += 1
        if s["status"] in ("fail", "hang") and f == 0:
            f += 1  # a crash or a hang without a failing case still counts
            failures.append(f"{name}: program {s['status'].upper()} ({s.get('reason', '')})")
        passed, failed, skipped = passed + p, failed + f, skipped + k
        per_program.append({"name": name, "status": s["status"], "seconds": s.get("seconds"), "passed": p,
                            "failed": f, "skipped": k})
    hangs = [p["name"] for p in per_program if p["status"] == "hang"]
    not_run = [p["name"] for p in per_program if p["status"] in ("skip", "missing")]
    detail = f"{passed} passed, {failed} failed, {skipped} skipped in {len(programs)} programs"
    if hangs:
        detail += f"; HANG: {', '.join(hangs)}"
    if not_run:
        detail += f"; {len(not_run)} not run (out of time): {', '.join(not_run[:8])}" + (" ..." if len(not_run) > 8 else "")
    if failures:
        detail += "; failed: " + "; ".join(failures[:5]) + (" ..." if len(failures) > 5 else "")
    other_skips = [k for k in skips if k not in cuda_skips]
    if other_skips and not dry:  # on a GPU every skip is named; the CUDA ones get their own line
        detail += "; skipped: " + "; ".join(other_skips[:5]) + (" ..." if len(other_skips) > 5 else "")
    v.add("tests pass", "PASS" if failed == 0 and not hangs and not not_run else "MISS", detail,
          {"passed": passed, "failed": failed, "skipped": skipped})
    if dry:
        v.add("CUDA instances run", "SKIP", f"dry run: {len(cuda_skips)} CUDA instances skipped (no GPU here), as they should",
              {"cuda_skipped": len(cuda_skips)})
    else:
        v.add("CUDA instances run", "PASS" if not cuda_skips else "MISS",
              "none skipped" if not cuda_skips else f"{len(cuda_skips)} skipped: " + "; ".join(cuda_skips[:6]),
              {"cuda_skipped": len(cuda_skips)})
    return {"programs": per_program, "passed": passed, "failed": failed, "skipped": skipped,
            "skipped_cases": skips, "cuda_skipped_cases": cuda_skips, "failed_cases": failures}


def train_section(out, steps, v):
    section = {}
    for ex in ("gpt", "mlp", "cnn"):
        j = load(os.path.join(out, f"train-{ex}.json"))
        if not j:
            why = why_missing(out, steps, f"train-{ex}")
            v.add(f"{ex} at 1/4: speed", "HANG" if why.startswith("HANG") else "FAIL", f"no figures: {why}")
            v.add(f"{ex} at 1/4: losses", "FAIL", "no figures")
            continue
        row = next((r for r in j.get("rows", []) if r.get("policy") == "auto"
                    and abs(r.get("budget_ratio", 0) - 0.25) < 1e-9), None)
        section[ex] = j
        if row is None or row.get("skipped"):
            why = row.get("reason", "no row") if row else "no auto row at 0.25"
            v.add(f"{ex} at 1/4: speed", "FAIL", f"not run: {why}")
            v.add(f"{ex} at 1/4: losses", "FAIL", f"not run: {why}")
            continue
        ratio = row.get("ratio") or 0
        throughput = 1 / ratio if ratio > 0 else 0
        figs = {"step_ms": row["step_ms"], "resident_step_ms": row["resident_step_ms"], "throughput_x": throughput,
                "budget_bytes": row["budget_bytes"], "footprint_bytes": j["footprint_bytes"],
                "stall_ms": row.get("stall_ms"), "h2d_bytes": row.get("h2d_bytes"), "d2h_bytes": row.get("d2h_bytes"),
                "planned_step_ms": row.get("planned_step_ms")}
        planned = row.get("planned_step_ms") or 0
        v.speed(f"{ex} at 1/4: speed", throughput >= SPEED_TARGET,
                f"{throughput:.2f}x of everything resident (>= {SPEED_TARGET}x): {row['step_ms']:.1f} ms/step vs "
                f"{row['resident_step_ms']:.1f} ms, budget {size(row['budget_bytes'])} of "
                f"{size(j['footprint_bytes'])}" + (f"; planned {planned:.1f} ms" if planned > 0 else ""), figs)
        v.add(f"{ex} at 1/4: losses", "PASS" if row.get("losses_match") else "MISS",
              "identical to the resident run" if row.get("losses_match") else "DIFFER from the resident run")
        host = next((r for r in j.get("rows", []) if r.get("policy") == "auto@host"
                     and abs(r.get("budget_ratio", 0) - 0.25) < 1e-9 and not r.get("skipped")), None)
        if host is not None:  # the Adam steps on the host CPU (host_ops = host)
            ok = host.get("losses_match") and (host.get("host_ops") or 0) > 0
            v.add(f"{ex} at 1/4, Adam on the host: losses", "PASS" if ok else "MISS",
                  f"{host.get('host_ops', 0)} host ops, losses "
                  + ("identical to the resident run" if host.get("losses_match") else "DIFFER from the resident run"))
    return section


def nvme_spill_section(out, steps, v):
    s = next((x for x in steps if x["name"] == "gpt-nvme"), None)
    if s is None or s["status"] == "skip":
        v.add("gpt with NVMe tier", "SKIP", s.get("reason", "not run") if s else "not run")
        return None
    res = load(os.path.join(out, "gpt-resident.json"))
    nv = load(os.path.join(out, "gpt-nvme.json"))
    if not nv or not res:
        name = "gpt-nvme" if not nv else "gpt-resident"
        why = why_missing(out, steps, name)
        v.add("gpt with NVMe tier", "HANG" if why.startswith("HANG") else "FAIL", f"no report from {name}: {why}")
        return None
    same = nv.get("losses") == res.get("losses") and bool(nv.get("losses"))
    figs = {"step_ms": nv.get("median_step_ms"), "resident_step_ms": res.get("median_step_ms"),
            "nvme_read_bytes": nv.get("nvme_read_bytes"), "nvme_write_bytes": nv.get("nvme_write_bytes"),
            "losses": nv.get("losses"), "resident_losses": res.get("losses")}
    spilled = (nv.get("nvme_write_bytes") or 0) > 0
    detail = (f"{nv.get('median_step_ms', 0):.1f} ms/step (resident {res.get('median_step_ms', 0):.1f} ms), NVMe "
              f"{size(nv.get('nvme_write_bytes'))} written, {size(nv.get('nvme_read_bytes'))} read; "
              f"losses {'identical' if same else 'DIFFER'}")
    if not spilled:
        detail += "; nothing reached the NVMe tier"
    v.add("gpt with NVMe tier", "PASS" if same and spilled else "MISS", detail, figs)
    return {"resident": res, "nvme": nv}


def step_figures(out, steps, v, step, target):
    """The JSON a step left, or None after a FAIL/HANG line that says why there is none."""
    figures = load(os.path.join(out, f"{step}.json"))
    if not figures:
        why = why_missing(out, steps, step)
        v.add(target, "HANG" if why.startswith("HANG") else "FAIL", f"no figures: {why}")
    return figures


def ratio_line(v, target, figures, key, goal, note):
    """A speed target: ours against the plain loop's GB/s of the same run."""
    ours, plain = figures[f"{key}_gbps"], figures[f"plain_{key}_gbps"]
    x = ours / plain if plain else 0
    v.speed(target, x >= goal, f"{ours:.2f} GB/s vs {plain:.2f} GB/s ({x:.2f}x, >= {goal}x; {note})",
            {"gbps": ours, "plain_gbps": plain, "ratio": x})


def copies_section(out, steps, v):
    c = step_figures(out, steps, v, "copies", "pinned copies vs plain loop")
    if not c:
        return None
    for d, name in (("h2d", "host-to-device"), ("d2h", "device-to-host")):
        ratio_line(v, f"pinned {name} vs plain loop", c, d, COPY_TARGET, f"plain: {c['plain']}")
    return c


def nvme_section(out, steps, v):
    n = step_figures(out, steps, v, "nvme", "NVMe tier vs plain liburing")
    if not n:
        return None
    if n.get("skipped"):
        v.add("NVMe tier vs plain liburing", "SKIP", n.get("reason", ""))
        return n
    kind = ("O_DIRECT" if n.get("direct_io") else "buffered") + (
        "" if n.get("direct_io") == n.get("plain_direct_io") else " vs plain " +
        ("O_DIRECT" if n.get("plain_direct_io") else "buffered"))
    for d in ("write", "read"):
        ratio_line(v, f"NVMe tier {d} vs plain liburing", n, d, NVME_TARGET, kind)
    return n


def overhead_section(out, steps, v):
    o = step_figures(out, steps, v, "overhead", "host cost per op")
    if not o:
        return None
    for row in o.get("rows", []):
        detail = (f"{row['host_us_per_op']:.2f} us per op beyond Device calls (<= {row['target_us']:g} us); "
                  f"an empty kernel launch {row['launch_us_per_op']:.2f} us")
        if "instructions_per_op" in row:
            detail += f"; {row['instructions_per_op']:.0f} instructions per op"
        # A speed figure like the others: informational in a dry run on a loaded 2-core machine;
        # `spillway-bench overhead` on a quiet machine is the measurement of record.
        v.speed(f"host cost per op, policy {row['policy']}", row["met"], detail, row)
    return o


def peers_section(out, steps, train, v):
    s = next((x for x in steps if x["name"] == "peers"), None)
    p = load(os.path.join(out, "peers.json"))
    shape = load(os.path.join(out, "gpt-shape.json")) or {}
    row = None
    if "gpt" in train:
        row = next((r for r in train["gpt"].get("rows", []) if r.get("policy") == "auto"
                    and abs(r.get("budget_ratio", 0) - 0.25) < 1e-9 and not r.get("skipped")), None)
    tokens = shape.get("batch", 0) * shape.get("seq", 0)
    ours = tokens / (row["step_ms"] / 1000) if row and row.get("step_ms") else 0
    section = {"spillway_tokens_per_s": ours, "tokens_per_step": tokens, "peers": p}
    if s is None or s["status"] == "skip":
        v.add("Spillway vs PyTorch at the same budget", "SKIP", s.get("reason", "not run") if s else "not run")
        return section
    if not p:
        why = why_missing(out, steps, "peers")
        v.add("Spillway vs PyTorch at the same budget", "HANG" if why.startswith("HANG") else "FAIL", f"no figures: {why}")
        return section
    if p.get("skipped"):
        v.add("Spillway vs PyTorch at the same budget", "SKIP", p.get("reason", ""))
        return section
    parts = []
    for r in p["rows"]:
        label = r["variant"] + ("" if r.get("capped", True) else " (no cap)")
        parts.append(f"{label} {r['tokens_per_s']:.0f}" if r["fits"] else f"{label} does not fit")
    best = p.get("best_fitting")
    detail = f"Spillway {ours:.0f} tokens/s; PyTorch at {size(p['budget_bytes'])}: " + ", ".join(parts)
    if best is None:
        v.speed("Spillway vs PyTorch at the same budget", ours > 0, detail + " (no PyTorch variant fits)",
                {"spillway_tokens_per_s": ours})
    else:
        v.speed("Spillway vs PyTorch at the same budget", ours >= best["tokens_per_s"],
                detail + f" (best that fits: {best['variant']}, {ours / best['tokens_per_s']:.2f}x)",
                {"spillway_tokens_per_s": ours, "pytorch_best_tokens_per_s": best["tokens_per_s"]})
    return section


def reruns_section(steps, v):
    """checkpoint's reruns checked bit for bit against each op's first run (gpt and cnn)."""
    runs = {s["name"]: s for s in steps if s["name"] in ("reruns-gpt", "reruns-cnn")}
    if not runs:
        v.add("reruns checked bit for bit (gpt, cnn)", "SKIP", "not run")
        return
    bad = [s for s in runs.values() if s["status"] in ("fail", "hang")]
    skipped = [s["name"] for s in runs.values() if s["status"] == "skip"]
    if bad:
        result = "HANG" if all(s["status"] == "hang" for s in bad) else "FAIL"
        v.add("reruns checked bit for bit (gpt, cnn)", result,
              "; ".join(f"{s['name']}: {s['status']} ({s.get('reason', '')}), see logs/{s['name']}.txt" for s in bad))
    elif len(runs) < 2 or skipped:
        v.add("reruns checked bit for bit (gpt, cnn)", "SKIP", "not run: " + ", ".join(skipped or ["one of the two"]))
    else:
        v.add("reruns checked bit for bit (gpt, cnn)", "PASS", "every rerun wrote its op's first bits")


def write_junit(out, steps, v):
    """One case per step and per verdict line, for scripts/lib/count_tests.py."""
    logs = os.path.join(out, "meson-logs")
    os.makedirs(logs, exist_ok=True)
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="gpu_check / gpu_check")
    for s in steps:
        if s["name"].startswith("test-"):
            continue  # the tests are one verdict line; their own cases are counted by scripts/test
        case = ET.SubElement(suite, "testcase", classname="gpu_check.step", name=s["name"])
        if s["status"] in ("fail", "hang"):
            ET.SubElement(case, "failure", message=f"{s['status']}: {s.get('reason', '')}")
        elif s["status"] == "skip":
            ET.SubElement(case, "skipped", message=s.get("reason", ""))
    for line in v.lines:
        case = ET.SubElement(suite, "testcase", classname="gpu_check.target", name=line["target"])
        if line["result"] in ("MISS", "FAIL", "HANG") and not line["informational"]:
            ET.SubElement(case, "failure", message=line["detail"])
        elif line["result"] == "SKIP":
            ET.SubElement(case, "skipped", message=line["detail"])
    ET.ElementTree(root).write(os.path.join(logs, "testlog.junit.xml"), encoding="unicode")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--missing-libs", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    steps = load_lines(os.path.join(a.out, "steps.jsonl"))
    v = Verdict(a.dry_run)

    if a.missing_libs:
        v.add("CUDA libraries found", "MISS", f"{a.missing_libs} not found (see the lib: lines)")
    tests = tests_section(a.out, a.bundle, steps, v, a.dry_run)
    train = train_section(a.out, steps, v)
    spill = nvme_spill_section(a.out, steps, v)
    copies = copies_section(a.out, steps, v)
    nvme = nvme_section(a.out, steps, v)
    overhead = overhead_section(a.out, steps, v)
    peers = peers_section(a.out, steps, train, v)
    reruns_section(steps, v)
    for s in steps:  # the steps no target above speaks for
        if s["status"] in ("hang", "fail") and s["name"] in ("starts", "cuda-info"):
            v.add(f"step {s['name']}", s["status"].upper(), why_missing(a.out, steps, s["name"]))

    report = {
        "dry_run": a.dry_run,
        "seconds": a.seconds,
        "bundle": load(os.path.join(a.bundle, "manifest.json")),
        "gpu": (open(os.path.join(a.out, "nvidia-smi.txt")).read().strip()
                if os.path.exists(os.path.join(a.out, "nvidia-smi.txt")) else None),
        "cuda": load(os.path.join(a.out, "cuda.json")),
        "cuda_libraries": load_lines(os.path.join(a.out, "cuda-libs.jsonl")),
        "steps": steps,
        "tests": tests,
        "train": train,
        "gpt_nvme": spill,
        "copies": copies,
        "nvme": nvme,
        "overhead": overhead,
        "peers": peers,
        "targets": {"speed_at_quarter": SPEED_TARGET, "copies": COPY_TARGET, "nvme": NVME_TARGET},
        "verdict": v.lines,
    }
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    write_junit(a.out, steps, v)

    print("== verdict" + (" (dry run on the cpu backend: speed targets are informational)" if a.dry_run else ""))
    width = max(len(x["target"]) for x in v.lines)
    for x in v.lines:
        note = "  (informational)" if x["informational"] and x["result"] == "MISS" else ""
        print(f"{x['result']:4}  {x['target']:{width}}  {x['detail']}{note}")
    bad = v.failed()
    print(f"gpu_check: {'PASS' if not bad else 'MISS'} ({len(bad)} of {len(v.lines)} targets missed) in {a.seconds:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
