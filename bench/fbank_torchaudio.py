#!/usr/bin/python3
"""Real-time factor of torchaudio.compliance.kaldi.fbank on one core, features only.

    /usr/bin/python3 bench/fbank_torchaudio.py FILES.txt [--repeats R] [--num-mel-bins N] [--snip-edges=false]

The torchaudio side of bench/bench_fbank.cpp: reads every 16-bit WAV of FILES.txt into float32 tensors on
Kaldi's int16 scale, runs torchaudio.compliance.kaldi.fbank (dither 0, energy_floor 0, Kaldi's defaults
otherwise, torch.set_num_threads(1)) on all of them R times (default 5) after a warm-up of 20 files, and
prints for the best repeat RTF = compute time / audio time, as wall-clock time and as the process's CPU
time (time.process_time). torch.set_num_threads(1) does not reach the BLAS threads behind the mel
step's matrix product: unpinned, the CPU time came out at 2x the wall time. For a one-core comparison
run it (and bench_fbank) under `taskset -c 0`, as docs/PERFORMANCE.md does.
"""
import argparse
import time
import wave

import numpy as np
import torch
import torchaudio.compliance.kaldi as kaldi


def main():
    p = argparse.ArgumentParser()
    p.add_argument("files")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--num-mel-bins", type=int, default=23)
    p.add_argument("--snip-edges", default="true")
    a = p.parse_args()
    torch.set_num_threads(1)
    xs = []
    for f in open(a.files).read().split():
        with wave.open(f) as w:
            rate = w.getframerate()
            xs.append(torch.from_numpy(np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32))[None])
    audio = sum(x.shape[1] for x in xs) / rate
    snip = a.snip_edges.lower() in ("true", "1")

    def run(x):
        return kaldi.fbank(x, dither=0.0, energy_floor=0.0, num_mel_bins=a.num_mel_bins, snip_edges=snip,
                           sample_frequency=rate)

    for x in xs[:20]:
        run(x)
    best_wall = best_cpu = float("inf")
    frames = 0
    for _ in range(a.repeats):
        t, c = time.perf_counter(), time.process_time()
        frames = sum(run(x).shape[0] for x in xs)
        best_cpu = min(best_cpu, time.process_time() - c)
        best_wall = min(best_wall, time.perf_counter() - t)
    print(f"torchaudio fbank: {len(xs)} files, {audio:.1f} s of audio, {frames} frames, {a.num_mel_bins} bins; "
          f"best of {a.repeats}: RTF {best_wall / audio:.6f} wall, {best_cpu / audio:.6f} CPU "
          f"({1e6 * best_cpu / frames:.2f} us per frame CPU)")


if __name__ == "__main__":
    main()
