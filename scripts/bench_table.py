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
  * issue 6's targets (docs/PERFORMANCE.md, "Targets at a glance"): per target the measured range over
    its shapes and how many of them meet it. Ratios between implementations or operations are ratios of
    time (above 1: normlab is faster, or for "[B,F,T] over contiguous", slower by that factor); "of copy"
    as above. A target whose benchmarks are not in the run (a --benchmark_filter) is left out.
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
    """The runs of Google Benchmark JSON files (or of files written by --combine); a file that cannot be read
    or is not such JSON ends the program with a one-line message naming it."""
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            sys.exit(f"bench_table: cannot read {path}: {e}")
        if not isinstance(data, dict) or not ("runs" in data or "benchmarks" in data):
            sys.exit(f"bench_table: {path} is not Google Benchmark JSON (no 'benchmarks' or 'runs')")
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


TIME_UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def collect(run, best=False, field="bytes_per_second"):
    """{(op, impl, shape): value or None (error)}; value: GB/s (field bytes_per_second) or µs (field
    real_time). Repetitions are reduced to their median (or best: the highest GB/s, the lowest time)."""
    def value(b):
        if field == "bytes_per_second":
            return b["bytes_per_second"] / 1e9
        return b["real_time"] * TIME_UNITS[b.get("time_unit", "ns")]

    pick = (max if field == "bytes_per_second" else min) if best else statistics.median
    samples, medians, errors = {}, {}, set()
    for b in run["benchmarks"]:
        key = parse_name(b.get("run_name", b["name"]))
        if key is None:
            continue
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median" and field in b and not best:
                medians[key] = value(b)
            continue
        if b.get("error_occurred"):
            errors.add(key)
            continue
        if field in b:
            samples.setdefault(key, []).append(value(b))
    out = {k: pick(v) for k, v in samples.items()}
    out.update(medians)
    for k in errors:
        out.setdefault(k, None)
    return out


def copy_references(gbs):
    """{shape: (GB/s, "Copy" or "CopyStream")}: the better of the two copy benchmarks at each shape that has
    one (from collect's GB/s)."""
    refs = {}
    for (op, impl, s), v in gbs.items():
        if impl == "copy" and op in ("Copy", "CopyStream") and v is not None:
            refs[s] = max(refs.get(s, (v, op)), (v, op))
    return refs


def fmt_gbs(v):
    return "error" if v is None else f"{v:.2f}"


def fmt_frac(v, ref):
    return "" if v is None or not ref else f"{100 * v / ref:.0f}%"


def fmt_ratio(a, b):
    return "" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def shape_order(shape):
    """In cache first, rows before [B,F,T], by the last extent, then by all extents (so that shapes with the
    same last extent, 6553x80 and 32000x80, keep one order: the sets they come from iterate in hash order)."""
    dims = tuple(int(p) for p in shape.split("x"))
    return (shape_bytes(shape) > IN_CACHE_LIMIT, len(dims), dims[-1], dims)


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
          f"date: {ctx.get('date', '?')}, load average at start: {load}, repetitions: {reps}{reduced}"
          f"{', huge pages: ' + ctx['huge_pages'] if 'huge_pages' in ctx else ''}\n")

    shapes = sorted({s for (_, _, s) in res}, key=shape_order)
    refs = copy_references(res)
    print("Copy roofline (GB/s, read + write); `copy` below = the better of the two:\n")
    print("| shape | size | BM_Copy (stores) | BM_CopyStream (NT stores) | copy reference |")
    print("|---|---|---:|---:|---|")
    for s in shapes:
        if s not in refs:
            continue
        cells = [fmt_gbs(res[(name, "copy", s)]) if (name, "copy", s) in res else "—"
                 for name in ("Copy", "CopyStream")]
        ref, which = refs[s]
        print(f"| {s} | {size_class(s)} | {cells[0]} | {cells[1]} | {which} {ref:.2f} |")
    print()
    print_targets(res, collect(run, best, "real_time"))

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
            ref = refs[s][0] if s in refs else None
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


ROW_SHAPES = ["8192x64", "6553x80", "2048x256", "682x768", "128x4096",
              "524288x64", "419430x80", "131072x256", "43690x768", "8192x4096"]
BFT, BFT_ROWS, BN = "32x80x1000", "32000x80", "64x256x400"


# How a target's value compares with its threshold: meets(value, threshold), and the worst of its points.
COMPARE = {">": (lambda v, t: v > t, min), "≥": (lambda v, t: v >= t, min), "≤": (lambda v, t: v <= t, max)}


def target_rows(gbs, us):
    """Issue 6's targets: [(target, [(shape, value)], comparison, threshold)], comparison a key of COMPARE.
    gbs: collect's GB/s (the copy references are its copy benchmarks), us: its times (µs)."""
    refs = copy_references(gbs)
    l3 = [s for s in ROW_SHAPES if size_class(s) == "in L3"]
    ooc = [s for s in ROW_SHAPES if size_class(s) != "in L3"]

    def of_copy(op, shapes):
        return [(s, gbs[(op, "normlab", s)] / refs[s][0]) for s in shapes
                if gbs.get((op, "normlab", s)) and s in refs and refs[s][0]]

    def speedup(op_peer, op_nl, peer, shapes):
        # time of the peer / time of normlab (> 1: normlab faster)
        return [(s, us[(op_peer, peer, s)] / us[(op_nl, "normlab", s)]) for s in shapes
                if us.get((op_peer, peer, s)) and us.get((op_nl, "normlab", s))]

    def bft_over_rows(op):
        a, b = us.get((op, "normlab", BFT)), us.get((op.replace("BFT", ""), "normlab", BFT_ROWS))
        return [(BFT, a / b)] if a and b else []

    def bn_fwd_bwd(bwd="BatchNormBwd"):
        # ATen's backward takes the forward's saved statistics either way; ours recomputes them
        # (BatchNormBwd) or takes them (BatchNormBwdSaved)
        t = [us.get(("BatchNormFwd", "aten", BN)), us.get(("BatchNormFwd", "normlab", BN)),
             us.get(("BatchNormBwd", "aten", BN)), us.get((bwd, "normlab", BN))]
        return [(BN, (t[0] + t[2]) / (t[1] + t[3]))] if all(t) else []

    def lowp(op16, op32, shapes):
        return [(s, us[(op32, "normlab", s)] / us[(op16, "normlab", s)]) for s in shapes
                if us.get((op32, "normlab", s)) and us.get((op16, "normlab", s))]

    allr = ROW_SHAPES
    return [
        ("LayerNorm forward, of copy out of cache (≥ 0.85)", of_copy("LayerNormFwd", ooc), "≥", 0.85),
        ("RMSNorm forward, of copy out of cache (≥ 0.85)", of_copy("RmsNormFwd", ooc), "≥", 0.85),
        ("LayerNorm forward, of copy in L3 (≥ 0.6)", of_copy("LayerNormFwd", l3), "≥", 0.6),
        ("RMSNorm forward, of copy in L3 (≥ 0.6)", of_copy("RmsNormFwd", l3), "≥", 0.6),
        ("LayerNorm forward against ATen, every shape (> 1)",
         speedup("LayerNormFwd", "LayerNormFwd", "aten", allr), ">", 1.0),
        ("LayerNorm forward against oneDNN, every shape (> 1)",
         speedup("LayerNormFwd", "LayerNormFwd", "onednn", allr), ">", 1.0),
        ("RMSNorm forward against ATen's composition, every shape (> 1)",
         speedup("RmsNormFwd", "RmsNormFwd", "aten", allr), ">", 1.0),
        ("LayerNorm forward against oneDNN in L3 (≥ 1.5)",
         speedup("LayerNormFwd", "LayerNormFwd", "onednn", l3), "≥", 1.5),
        ("LayerNorm forward against ATen in L3 (≥ 3)",
         speedup("LayerNormFwd", "LayerNormFwd", "aten", l3), "≥", 3.0),
        ("RMSNorm forward against ATen in L3 (≥ 3)", speedup("RmsNormFwd", "RmsNormFwd", "aten", l3), "≥", 3.0),
        ("LayerNorm backward from saved statistics, of copy out of cache (≥ 0.75)",
         of_copy("LayerNormBwdSaved", ooc), "≥", 0.75),
        ("LayerNorm backward recomputing, of copy out of cache (≥ 0.75)", of_copy("LayerNormBwd", ooc), "≥", 0.75),
        ("LayerNorm backward from saved statistics against ATen in L3 (≥ 2)",
         speedup("LayerNormBwd", "LayerNormBwdSaved", "aten", l3), "≥", 2.0),
        ("LayerNorm backward from saved statistics against oneDNN in L3 (≥ 2)",
         speedup("LayerNormBwd", "LayerNormBwdSaved", "onednn", l3), "≥", 2.0),
        ("[B,F,T] forward over F, time over contiguous rows (≤ 1.3)", bft_over_rows("LayerNormFwdBFT"), "≤", 1.3),
        ("[B,F,T] backward over F, time over contiguous rows (≤ 1.3)",
         bft_over_rows("LayerNormBwdBFT"), "≤", 1.3),
        ("[B,F,T] forward against the LibTorch permute route (≥ 10)",
         speedup("LayerNormFwdBFT", "LayerNormFwdBFT", "aten", [BFT]), "≥", 10.0),
        ("[B,F,T] backward recomputing against the LibTorch permute route (≥ 10)",
         speedup("LayerNormBwdBFT", "LayerNormBwdBFT", "aten", [BFT]), "≥", 10.0),
        # (the permute route is given the mean and rstd of a forward, as the row targets' peers are)
        ("[B,F,T] backward from saved statistics against the LibTorch permute route (≥ 10)",
         speedup("LayerNormBwdBFT", "LayerNormBwdBFTSaved", "aten", [BFT]), "≥", 10.0),
        ("BatchNorm training forward + backward against ATen (≥ 3)", bn_fwd_bwd(), "≥", 3.0),
        ("BatchNorm training forward + backward from saved statistics against ATen (≥ 3)",
         bn_fwd_bwd("BatchNormBwdSaved"), "≥", 3.0),
        ("bf16 LayerNorm forward against our fp32, out of cache (≥ 1.7)",
         lowp("LayerNormFwdBF16", "LayerNormFwd", ooc), "≥", 1.7),
        ("bf16 RMSNorm forward against our fp32, out of cache (≥ 1.7)",
         lowp("RmsNormFwdBF16", "RmsNormFwd", ooc), "≥", 1.7),
        ("bf16 LayerNorm backward against our fp32, out of cache (≥ 1.7)",
         lowp("LayerNormBwdBF16", "LayerNormBwd", ooc), "≥", 1.7),
        ("bf16 fused residual add + LayerNorm forward against our fp32, out of cache (≥ 1.7)",
         lowp("AddLayerNormFwdBF16", "AddLayerNormFwd", ooc), "≥", 1.7),
        ("bf16 fused residual add + LayerNorm backward against our fp32, out of cache (≥ 1.7)",
         lowp("AddLayerNormBwdBF16", "AddLayerNormBwd", ooc), "≥", 1.7),
    ]


def print_targets(gbs, us):
    rows = [r for r in target_rows(gbs, us) if r[1]]
    if not rows:
        return
    print("Issue 6's targets (ratios of time; the worst point is named):\n")
    print("| target | measured | worst at | met |")
    print("|---|---|---|---|")
    for name, points, cmp, thr in rows:
        meets, worst_of = COMPARE[cmp]
        vals = [v for _, v in points]
        ok = [meets(v, thr) for v in vals]
        worst = worst_of(points, key=lambda p: p[1])
        rng = f"{min(vals):.2f}" if len(vals) == 1 else f"{min(vals):.2f}–{max(vals):.2f}"
        print(f"| {name} | {rng} | {worst[0]} | {sum(ok)} of {len(ok)} |")
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
