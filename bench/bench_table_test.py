#!/usr/bin/python3
"""Tests of scripts/bench_table.py's target summary on a hand-made Google Benchmark run (stdlib only)."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import bench_table  # noqa: E402


def bench(name, t, gbs, unit="us"):
    """One iteration entry: real time t in `unit`, gbs GB/s."""
    return {"name": name + "/real_time", "run_name": name + "/real_time", "run_type": "iteration",
            "real_time": t, "time_unit": unit, "bytes_per_second": gbs * 1e9}


def run_of(benchmarks, threads="1"):
    return {"context": {"threads": threads}, "benchmarks": benchmarks}


# One in-L3 and one out-of-cache row shape, the [B,F,T] problem and BatchNorm; times in µs (the [B,F,T]
# ones in ms). GB/s chosen so that the fractions of copy are easy: copy 100 GB/s in L3 (ordinary stores beat
# streaming ones there), 20 GB/s out of cache (streaming stores win).
RUN = run_of([
    bench("BM_Copy/copy/8192x64", 10, 100), bench("BM_CopyStream/copy/8192x64", 20, 50),
    bench("BM_Copy/copy/524288x64", 100, 10), bench("BM_CopyStream/copy/524288x64", 50, 20),
    bench("BM_LayerNormFwd/normlab/8192x64", 30, 70), bench("BM_LayerNormFwd/aten/8192x64", 120, 17.5),
    bench("BM_LayerNormFwd/onednn/8192x64", 40, 52.5),
    bench("BM_LayerNormFwd/normlab/524288x64", 200, 18), bench("BM_LayerNormFwd/aten/524288x64", 150, 24),
    bench("BM_LayerNormFwdBF16/normlab/524288x64", 100, 18),
    bench("BM_AddLayerNormFwd/normlab/524288x64", 400, 20),
    bench("BM_AddLayerNormFwdBF16/normlab/524288x64", 250, 16),
    bench("BM_AddLayerNormBwdBF16/normlab/524288x64", 250, 16),
    bench("BM_LayerNormFwd/normlab/32000x80", 1000, 20),
    bench("BM_LayerNormFwdBFT/normlab/32x80x1000", 1.25, 16, unit="ms"),
    bench("BM_LayerNormFwdBFT/aten/32x80x1000", 12.5, 1.6, unit="ms"),
    bench("BM_LayerNormBwdBFT/normlab/32x80x1000", 2.0, 15, unit="ms"),
    bench("BM_LayerNormBwdBFTSaved/normlab/32x80x1000", 1.6, 19, unit="ms"),
    bench("BM_LayerNormBwdBFT/aten/32x80x1000", 8.0, 3.8, unit="ms"),
    bench("BM_BatchNormFwd/normlab/64x256x400", 2000, 10),
    bench("BM_BatchNormFwd/aten/64x256x400", 8000, 2.5),
    bench("BM_BatchNormBwd/normlab/64x256x400", 4000, 10),
    bench("BM_BatchNormBwd/aten/64x256x400", 10000, 4),
    bench("BM_BatchNormBwdSaved/normlab/64x256x400", 3000, 13),
])


def targets(run):
    rows = bench_table.target_rows(bench_table.collect(run), bench_table.collect(run, field="real_time"))
    return {name: (dict(points), cmp, thr) for name, points, cmp, thr in rows if points}


def printed(run, *args):
    """scripts/bench_table.py's output for `run` (written to a file), with extra arguments."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.json")
        with open(path, "w") as f:
            json.dump(run, f)
        out = io.StringIO()
        argv = sys.argv
        sys.argv = ["bench_table.py", path, *args]
        try:
            with contextlib.redirect_stdout(out):
                bench_table.main()
        finally:
            sys.argv = argv
    return out.getvalue()


class TargetsTest(unittest.TestCase):
    def test_fractions_of_copy_use_the_better_copy(self):
        t = targets(RUN)
        self.assertAlmostEqual(t["LayerNorm forward, of copy in L3 (≥ 0.6)"][0]["8192x64"], 0.7)
        self.assertAlmostEqual(t["LayerNorm forward, of copy out of cache (≥ 0.85)"][0]["524288x64"], 0.9)

    def test_peer_ratios_are_ratios_of_time(self):
        t = targets(RUN)
        aten = t["LayerNorm forward against ATen, every shape (> 1)"][0]
        self.assertAlmostEqual(aten["8192x64"], 4.0)
        self.assertAlmostEqual(aten["524288x64"], 0.75)
        self.assertAlmostEqual(t["LayerNorm forward against oneDNN in L3 (≥ 1.5)"][0]["8192x64"], 40 / 30)

    def test_bft_batchnorm_and_bf16_across_time_units(self):
        t = targets(RUN)
        self.assertAlmostEqual(
            t["[B,F,T] forward over F, time over contiguous rows (≤ 1.3)"][0]["32x80x1000"], 1.25)
        self.assertAlmostEqual(
            t["[B,F,T] forward against the LibTorch permute route (≥ 10)"][0]["32x80x1000"], 10.0)
        # The backward: ATen's permute route (8 ms) against the recomputing and the saved-statistics kernels.
        self.assertAlmostEqual(
            t["[B,F,T] backward recomputing against the LibTorch permute route (≥ 10)"][0]["32x80x1000"], 4.0)
        self.assertAlmostEqual(
            t["[B,F,T] backward from saved statistics against the LibTorch permute route (≥ 10)"][0]
            ["32x80x1000"], 5.0)
        bn = t["BatchNorm training forward + backward against ATen (≥ 3)"][0]
        self.assertAlmostEqual(bn["64x256x400"], 3.0)
        # From saved statistics: ATen's 18 ms over our 2 + 3 ms.
        bn = t["BatchNorm training forward + backward from saved statistics against ATen (≥ 3)"][0]
        self.assertAlmostEqual(bn["64x256x400"], 3.6)
        self.assertAlmostEqual(
            t["bf16 LayerNorm forward against our fp32, out of cache (≥ 1.7)"][0]["524288x64"], 2.0)
        self.assertAlmostEqual(
            t["bf16 fused residual add + LayerNorm forward against our fp32, out of cache (≥ 1.7)"][0]
            ["524288x64"], 1.6)
        # (no fp32 fused backward in the run: the bf16 one has nothing to be compared with)
        self.assertNotIn("bf16 fused residual add + LayerNorm backward against our fp32, out of cache (≥ 1.7)", t)

    def test_targets_without_benchmarks_are_left_out(self):
        t = targets(RUN)
        self.assertNotIn("RMSNorm forward, of copy in L3 (≥ 0.6)", t)
        self.assertNotIn("[B,F,T] backward over F, time over contiguous rows (≤ 1.3)", t)

    def test_copy_reference_is_the_better_copy(self):
        refs = bench_table.copy_references(bench_table.collect(RUN))
        self.assertEqual(refs["8192x64"], (100.0, "Copy"))
        self.assertEqual(refs["524288x64"], (20.0, "CopyStream"))

    def test_repetitions_give_the_median_unless_best(self):
        # Three repetitions of normlab's forward at 8192x64 (30, 60, 90 µs) against ATen's 120 µs: the median
        # gives 2.00; --best, the fastest repetition, 4.00.
        reps = [b for b in RUN["benchmarks"] if b["name"] != "BM_LayerNormFwd/normlab/8192x64/real_time"]
        reps += [bench("BM_LayerNormFwd/normlab/8192x64", t, 70) for t in (30, 60, 90)]
        run = run_of(reps)
        self.assertIn("| LayerNorm forward against ATen in L3 (≥ 3) | 2.00 | 8192x64 | 0 of 1 |", printed(run))
        self.assertIn("| LayerNorm forward against ATen in L3 (≥ 3) | 4.00 | 8192x64 | 1 of 1 |",
                      printed(run, "--best"))

    def test_printed_table_counts_met_points(self):
        text = printed(RUN)
        # ATen: 4.0 at 8192x64 meets "> 1", 0.75 at 524288x64 does not; the worst point is named.
        self.assertIn("| LayerNorm forward against ATen, every shape (> 1) | 0.75–4.00 | 524288x64 | 1 of 2 |",
                      text)
        # ≤ 1.3 is met by 1.25; 3.0 meets ≥ 3 (a boundary value counts as met).
        self.assertIn("| [B,F,T] forward over F, time over contiguous rows (≤ 1.3) | 1.25 | 32x80x1000 "
                      "| 1 of 1 |", text)
        self.assertIn("| BatchNorm training forward + backward against ATen (≥ 3) | 3.00 | 64x256x400 "
                      "| 1 of 1 |", text)

    def test_shapes_with_the_same_last_extent_keep_one_order(self):
        # (the shapes come from sets, whose order changes with the hash seed)
        for shapes in (["32000x80", "6553x80"], ["6553x80", "32000x80"]):
            self.assertEqual(sorted(shapes, key=bench_table.shape_order), ["6553x80", "32000x80"])

    def test_unreadable_input_is_a_one_line_error(self):
        with tempfile.TemporaryDirectory() as d:
            cases = {"truncated.json": '{"benchmarks": [', "list.json": "[1, 2]", "other.json": '{"a": 1}'}
            for name, text in cases.items():
                path = os.path.join(d, name)
                with open(path, "w") as f:
                    f.write(text)
                with self.assertRaises(SystemExit) as cm:
                    bench_table.load_runs([path])
                self.assertIn(path, str(cm.exception.code))
            with self.assertRaises(SystemExit) as cm:
                bench_table.load_runs([os.path.join(d, "missing.json")])
            self.assertIn("cannot read", str(cm.exception.code))


if __name__ == "__main__":
    unittest.main()
