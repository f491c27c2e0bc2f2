#!/usr/bin/python3
"""Markdown tables from normlab_bench's Google Benchmark JSON (stdlib only).

Usage:
  scripts/bench_table.py RESULTS.json [MORE.json ...] [--wide] [--best]
  scripts/bench_table.py --combine OUT.json RUN-1t.json RUN-2t.json [--wide] [--best]

Each input is either one Google Benchmark JSON file (one run of bench/normlab_bench at one thread
count) or a combined file {"runs": [<gbench json>, ...]} as written by --combine. Runs are told apart by
their context "threads" (NORMLAB_BENCH_THREADS).

For every thread count it prints:
  * the copy roofline per shape: BM_Copy (ordinary stores) and BM_CopyStream (non-temporal stores);
    the reference ("copy") for a shape is the BETTER of the two, because neither wins everywhere
    (ordinary stores win when the data stays in cache, streaming stores when it does not);
  * one row per (op, shape, impl): GB/s (the benchmark's bytes_per_second / 1e9, bytes = what the
    ideal kernel reads + writes, see bench/bench_norm.cpp), the fraction of the copy reference, and
    for the peers (aten, onednn) normlab's speed divided by theirs (> 1: normlab is faster).
With --wide: one row per (op, shape) with all implementations side by side instead.
Repetitions (--benchmark_repetitions) are reduced to their median, or with --best to their best.
"""

import argparse
import json
import math
import signal
import statistics
import sys

IMPLS = ["normlab", "aten", "onednn"]
PEERS = ["aten", "onednn"]
IN_CACHE_LIMIT = 16 << 20  # bytes of x; the harness uses 2 MiB (and 10 MB for BFT) vs 128 MiB


def load_runs(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        runs.extend(data["runs"] if "runs" in data else [data])
    return runs


def parse_name(name):
    """'BM_LayerNormFwd/aten/4096x768/real_time' -> ('LayerNormFwd', 'aten', '4096x768')."""
    parts = [p for p in name.split("/") if ":" not in p and p not in ("real_time", "manual_time")]
    if len(parts) != 3 or not parts[0].startswith("BM_"):
        return None
    return parts[0][3:], parts[1], parts[2]


def shape_bytes(shape):
    return 4 * math.prod(int(s) for s in shape.split("x"))


def size_class(shape):
    return "in L3" if shape_bytes(shape) <= IN_CACHE_LIMIT else "out of cache"


def collect(run, best=False):
    """{(op, impl, shape): GB/s or None (error)}; repetitions are reduced to their median (or best)."""
    samples, medians, errors = {}, {}, set()
    for b in run["benchmarks"]:
        key = parse_name(b.get("run_name", b["name"]))
        if key is None:
            continue
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median" and "bytes_per_second" in b and not best:
                medians[key] = b["bytes_per_second"] / 1e9
            continue
        if b.get("error_occurred"):
            errors.add(key)
            continue
        samples.setdefault(key, []).append(b["bytes_per_second"] / 1e9)
    out = {k: max(v) if best else statistics.median(v) for k, v in samples.items()}
    out.update(medians)
    for k in errors:
        out.setdefault(k, None)
    return out


def fmt_gbs(v):
    return "error" if v is None else f"{v:.2f}"


def fmt_frac(v, ref):
    return "" if v is None or not ref else f"{100 * v / ref:.0f}%"


def fmt_ratio(a, b):
    return "" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def shape_order(shape):
    return (shape_bytes(shape) > IN_CACHE_LIMIT, len(shape.split("x")), int(shape.split("x")[-1]))


def print_run(run, wide, best):
    ctx = run.get("context", {})
    res = collect(run, best)
    threads = ctx.get("threads", "?")
    load = ", ".join(f"{v:.2f}" for v in ctx.get("load_avg", [])) or "?"
    reps = max((b.get("repetitions", 1) for b in run["benchmarks"]), default=1)
    print(f"### threads = {threads}\n")
    reduced = " (best of them)" if best and reps > 1 else ""
    print(f"isa: {ctx.get('isa', '?')}, host: {ctx.get('host_name', '?')}, "
          f"{ctx.get('num_cpus', '?')} CPUs @ {ctx.get('mhz_per_cpu', '?')} MHz, "
          f"date: {ctx.get('date', '?')}, load average at start: {load}, repetitions: {reps}{reduced}\n")

    shapes = sorted({s for (_, _, s) in res}, key=shape_order)
    copy_ref = {}
    print("Copy roofline (GB/s, read + write); `copy` below = the better of the two:\n")
    print("| shape | size | BM_Copy (stores) | BM_CopyStream (NT stores) | copy reference |")
    print("|---|---|---:|---:|---|")
    for s in shapes:
        cells, cands = [], []
        for name in ("Copy", "CopyStream"):
            key = (name, "copy", s)
            cells.append(fmt_gbs(res[key]) if key in res else "—")
            if res.get(key) is not None:
                cands.append((res[key], name))
        if not cands:
            continue
        best, which = max(cands)
        copy_ref[s] = best
        print(f"| {s} | {size_class(s)} | {cells[0]} | {cells[1]} | {which} {best:.2f} |")
    print()

    op_order = ["LayerNormFwd", "LayerNormBwd", "LayerNormFwdBFT"]
    ops = sorted({o for (o, i, _) in res if i in IMPLS},
                 key=lambda o: (op_order.index(o) if o in op_order else len(op_order), o))
    if not ops:
        return
    if wide:
        head = "| op | shape | size | copy GB/s | " + " | ".join(f"{i} GB/s (% copy)" for i in IMPLS)
        head += " | " + " | ".join(f"normlab/{p}" for p in PEERS) + " |"
        print(head)
        print("|---|---|---|---:|" + "---:|" * (len(IMPLS) + len(PEERS)))
    else:
        print("| op | shape | size | impl | GB/s | % of copy | normlab/peer |")
        print("|---|---|---|---|---:|---:|---:|")
    for op in ops:
        for s in shapes:
            vals = {i: res[(op, i, s)] for i in IMPLS if (op, i, s) in res}
            if not vals:
                continue
            ref = copy_ref.get(s)
            nl = vals.get("normlab")
            if wide:
                cells = [f"{fmt_gbs(vals[i])} ({fmt_frac(vals[i], ref)})" if i in vals else "—"
                         for i in IMPLS]
                ratios = [fmt_ratio(nl, vals.get(p)) or "—" for p in PEERS]
                row = [op, s, size_class(s), fmt_gbs(ref)] + cells + ratios
                print("| " + " | ".join(row) + " |")
            else:
                for i in IMPLS:
                    if i not in vals:
                        continue
                    ratio = "" if i == "normlab" else fmt_ratio(nl, vals[i])
                    print(f"| {op} | {s} | {size_class(s)} | {i} | {fmt_gbs(vals[i])} | "
                          f"{fmt_frac(vals[i], ref)} | {ratio} |")
    print()


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="Google Benchmark JSON files or combined files")
    ap.add_argument("--combine", metavar="OUT", help="also write all runs into one combined JSON file")
    ap.add_argument("--wide", action="store_true",
                    help="one row per (op, shape), implementations side by side")
    ap.add_argument("--best", action="store_true",
                    help="with --benchmark_repetitions, take each benchmark's best repetition instead of "
                         "the median (for a machine shared with other work, where slow outliers are "
                         "interference)")
    args = ap.parse_args()

    runs = load_runs(args.inputs)
    if not runs:
        sys.exit("no runs in the input")
    runs.sort(key=lambda r: int(r.get("context", {}).get("threads", "0")))
    if args.combine:
        with open(args.combine, "w") as f:
            json.dump({"runs": runs}, f, indent=1)
            f.write("\n")
    for run in runs:
        print_run(run, args.wide, args.best)


if __name__ == "__main__":
    main()
