#!/usr/bin/python3
"""Per-call time of the Python module's LayerNorm forward and backward, allocation of the results included.

What a NumPy user sees per call: the module allocates every result, so a result of 2 MiB or more costs
a mapping, its page faults and the kernel's zeroing unless the storage keeps freed mappings
(include/normlab/tensor.h, "storage"); and the inputs are read from NumPy's 4 KiB pages or, when made by
normlab.empty, from huge pages; float64 inputs are converted to float32 first; bfloat16 inputs (their bits
in uint16 arrays from normlab.empty, storage="bfloat16") move half the bytes. Compare with
NORMLAB_HUGE_PAGES=0 (every array in 4 KiB pages, results from the aligned operator new) in the
environment; docs/PERFORMANCE.md, "nineteenth session", has a run.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/bench_python.py --threads 1
    NORMLAB_HUGE_PAGES=0 PYTHONPATH=build/release/python /usr/bin/python3 bench/bench_python.py --threads 1
"""
import argparse
import os
import time

import numpy as np

import normlab


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--shapes", default="43690x768,8192x4096,1365x768",
                    help="comma-separated ROWSxD (default: the benchmark's out-of-cache shapes and one in L3)")
    args = ap.parse_args()
    normlab.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    pages = "huge pages off" if os.environ.get("NORMLAB_HUGE_PAGES") == "0" else "huge pages on"
    for spec in args.shapes.split(","):
        rows, d = (int(v) for v in spec.split("x"))
        x_np = rng.standard_normal((rows, d)).astype(np.float32)
        dy_np = rng.standard_normal((rows, d)).astype(np.float32)
        # The same values in arrays from normlab.empty (the module's storage).
        x_nl, dy_nl = normlab.empty(x_np.shape), normlab.empty(dy_np.shape)
        np.copyto(x_nl, x_np)
        np.copyto(dy_nl, dy_np)
        # float64 inputs, which the module converts to float32 first (in its storage since the twentieth
        # session; in NumPy's allocation before).
        x64, dy64 = x_np.astype(np.float64), dy_np.astype(np.float64)
        # bfloat16 storage: the bits (uint16) in normlab.empty arrays, storage="bfloat16".
        x_bf, dy_bf = normlab.empty(x_np.shape, np.uint16), normlab.empty(dy_np.shape, np.uint16)
        np.copyto(x_bf, normlab.to_bfloat16(x_np))
        np.copyto(dy_bf, normlab.to_bfloat16(dy_np))
        for inputs, x, dy, st in (("NumPy inputs", x_np, dy_np, None),
                                  ("normlab.empty inputs", x_nl, dy_nl, None),
                                  ("float64 NumPy inputs", x64, dy64, None),
                                  ("bfloat16 normlab.empty inputs", x_bf, dy_bf, "bfloat16")):
            for name, call in (("layer_norm", lambda: normlab.layer_norm(x, storage=st)),
                               ("layer_norm_backward", lambda: normlab.layer_norm_backward(dy, x, storage=st))):
                times = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    result = call()
                    times.append(time.perf_counter() - t0)
                    del result
                times.sort()
                print(f"{pages}, {args.threads} thread(s), {inputs}, {name} {rows}x{d}: "
                      f"median {times[len(times) // 2] * 1e3:.2f} ms, min {times[0] * 1e3:.2f} ms over {args.calls} calls")


if __name__ == "__main__":
    main()
