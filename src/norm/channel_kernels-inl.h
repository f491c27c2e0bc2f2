// Channel kernels, compiled once per target: include with NL_TARGET defined to the target's name.
// See channel_kernels.h for the contract and docs/numerics.md for the error bounds. No include guard on
// purpose.
#ifndef NL_TARGET
#error "define NL_TARGET before including channel_kernels-inl.h"
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "norm/channel_kernels.h"
#include "norm/mean_split.h"
#include "simd/vec.h"

namespace normlab::kernels::NL_TARGET {
namespace chan {  // apart from the row and column kernels' names of the same target
namespace {

using namespace vec;  // NOLINT: the vector layer of this target

// A vector of p[i..i+k): a full load when k = kF, else zero-padded.
inline VF load_k(const float* p, Index i, int k) {
  return k == kF ? load(p + i) : load_n(p + i, k);
}

// How far ahead the first pass prefetches its inputs, in bytes (4 KiB). On the Intel Xeon of
// docs/PERFORMANCE.md's twenty-fourth session the hardware prefetcher alone left the statistics pass over
// [64, 256, 400] at 1.6 ms (x alone) and 2.5 ms (x and dy) where a read of x took 0.6 ms; with these
// prefetches 1.2 and 1.9 ms.
inline constexpr Index kStatsPrefetchBytes = 4096;

// First pass: Σx and (Dy) Σdy in double, blocks of 32 (element i to accumulator (i / 8) mod 4, lane
// i mod 8), a tail shorter than 32 zero-padded; total hsum((a0 + a1) + (a2 + a3)).
// Prefetches as pf says (channel_kernels.h, StatsPrefetch). Sx false (with Dy): Σdy alone (sx = 0), x still
// prefetched for the second pass.
template <bool Dy, bool Sx = true>
inline void first_pass(const float* x, const float* dy, Index n, const StatsPrefetch& pf, double& sx,
                       double& sdy) {
  constexpr Index kAhead = kStatsPrefetchBytes / Index{sizeof(float)};  // the same distance in floats
  VD a0 = zerod(), a1 = zerod(), a2 = zerod(), a3 = zerod();
  VD b0 = zerod(), b1 = zerod(), b2 = zerod(), b3 = zerod();
  Index i = 0;
  // The look-ahead past pf.end: offset jr in run r from x_next's (jr ≥ −32 once it is used).
  Index jr = kAhead - pf.end;
  Index r = 0;
  const float* qx = pf.x_next;
  const float* qdy = pf.dy_next;
  // Scalar math: ax[(i / 8) % 4][i % 8] += double(x[i]); ady likewise with dy[i]
  for (; i + 32 <= n; i += 32, jr += 32) {
    // Both lines of x (and dy) kStatsPrefetchBytes ahead: past the segment's end too, into the next
    // segment when they follow each other in memory (BatchNorm's contiguous [N, C, T]), or into the
    // caller's next runs (pf.x_next).
    if (i + kAhead + 32 <= pf.end) {
      prefetch_ahead<kStatsPrefetchBytes, 2>(x + i);
      if constexpr (Dy) prefetch_ahead<kStatsPrefetchBytes, 2>(dy + i);
    } else if (qx) {
      bool wrapped = false;
      while (qx && pf.run > 0 && jr >= pf.run) {  // on to the next run (amortized: jr grows by 32 a step)
        jr -= pf.run;
        wrapped = true;
        if (++r == pf.runs) {
          qx = nullptr;
          break;
        }
        qx += pf.x_step;
        if constexpr (Dy) qdy += pf.dy_step;
      }
      if (qx) {
        // The lines straddling the first run's start from it (jr ≥ −32); after a wrap (0 ≤ jr < 32) the
        // new run's first line too.
        const Index j = std::max<Index>(jr, 0);
        prefetch_ahead<0, 2>(qx + j);
        if constexpr (Dy) prefetch_ahead<0, 2>(qdy + j);
        if (wrapped && j > 0) {
          prefetch_ahead<0, 1>(qx);
          if constexpr (Dy) prefetch_ahead<0, 1>(qdy);
        }
      }
    }
    if constexpr (Sx) {
      a0 = add(a0, load_cvt(x + i));
      a1 = add(a1, load_cvt(x + i + 8));
      a2 = add(a2, load_cvt(x + i + 16));
      a3 = add(a3, load_cvt(x + i + 24));
    }
    if constexpr (Dy) {
      b0 = add(b0, load_cvt(dy + i));
      b1 = add(b1, load_cvt(dy + i + 8));
      b2 = add(b2, load_cvt(dy + i + 16));
      b3 = add(b3, load_cvt(dy + i + 24));
    }
  }
  if (i < n) {
    const int k = static_cast<int>(n - i);
    if constexpr (Sx) {
      const VF u = load_n(x + i, std::min(k, kF));
      const VF v = k > kF ? load_n(x + i + kF, k - kF) : zerof();
      a0 = add(a0, cvt_lo(u));
      a1 = add(a1, cvt_hi(u));
      a2 = add(a2, cvt_lo(v));
      a3 = add(a3, cvt_hi(v));
    }
    if constexpr (Dy) {
      const VF p = load_n(dy + i, std::min(k, kF));
      const VF q = k > kF ? load_n(dy + i + kF, k - kF) : zerof();
      b0 = add(b0, cvt_lo(p));
      b1 = add(b1, cvt_hi(p));
      b2 = add(b2, cvt_lo(q));
      b3 = add(b3, cvt_hi(q));
    }
  }
  sx = Sx ? hsum(add(add(a0, a1), add(a2, a3))) : 0.0;
  sdy = Dy ? hsum(add(add(b0, b1), add(b2, b3))) : 0.0;
}

// Pairwise fp32 sum of v[0..V): ((v0 + v1) + (v2 + v3)) for V = 4, and that of v[0..4) plus that of v[4..8)
// for V = 8.
template <int V>
inline VF tree(const VF* v) {
  if constexpr (V == 4)
    return add(add(v[0], v[1]), add(v[2], v[3]));
  else
    return add(tree<4>(v), tree<4>(v + 4));
}

// Second pass around m_hi: e = x − m_hi in fp32; Σe² and (Dy) Σdy·e from fp32 squares / products summed
// in fp32 over blocks of 128 elements (eight vectors, tree<8>) while 128 remain, then one block of 64
// (four vectors, tree<4>) if 64 remain, then the rest as a zero-padded block of 64 with e masked to 0;
// each block sum's lanes 0..7 and 8..15 added to two double accumulators; total hsum(acc0 + acc1).
// Sq false: Σdy·e alone (sq = 0), its operations unchanged.
template <bool Dy, bool Sq = true>
inline void second_pass(const float* x, const float* dy, Index n, VF mh, double& sq, double& sge) {
  VD q0 = zerod(), q1 = zerod(), p0 = zerod(), p1 = zerod();
  // One block of V vectors from i (k[u] valid lanes in vector u when tail).
  auto block = [&](auto vc, Index i, const int* k, bool tail) {
    constexpr int V = decltype(vc)::value;
    VF e[V], g[V], t[V];
    for (int u = 0; u < V; ++u) {
      const Index at = i + u * kF;
      e[u] = sub(!tail ? load(x + at) : k[u] ? load_n(x + at, k[u]) : zerof(), mh);
      if (tail) e[u] = keep_n(e[u], k[u]);
      if constexpr (Dy) g[u] = !tail ? load(dy + at) : k[u] ? load_n(dy + at, k[u]) : zerof();
    }
    if constexpr (Sq) {
      for (int u = 0; u < V; ++u) t[u] = mul(e[u], e[u]);
      const VF q = tree<V>(t);
      q0 = add(q0, cvt_lo(q));
      q1 = add(q1, cvt_hi(q));
    }
    if constexpr (Dy) {
      for (int u = 0; u < V; ++u) t[u] = mul(g[u], e[u]);
      const VF p = tree<V>(t);
      p0 = add(p0, cvt_lo(p));
      p1 = add(p1, cvt_hi(p));
    }
  };
  using Eight = std::integral_constant<int, 8>;
  using Four = std::integral_constant<int, 4>;
  static constexpr int kFull[8] = {kF, kF, kF, kF, kF, kF, kF, kF};
  Index i = 0;
  // Scalar math: e = x[i] − m_hi; Σe² += e·e; Σdy·e += dy[i]·e (fp32 blocks of 128, then
  // of 64, then a zero-padded tail block of 64; double accumulators)
  for (; i + 8 * kF <= n; i += 8 * kF) block(Eight{}, i, kFull, false);
  if (i + 4 * kF <= n) {
    block(Four{}, i, kFull, false);
    i += 4 * kF;
  }
  if (i < n) {
    int k[4];
    for (int u = 0; u < 4; ++u) k[u] = static_cast<int>(std::clamp<Index>(n - i - u * kF, 0, kF));
    block(Four{}, i, k, true);
  }
  sq = Sq ? hsum(add(q0, q1)) : 0.0;
  sge = Dy ? hsum(add(p0, p1)) : 0.0;
}

// A mean's fp32 pair (split_mean): returns m_hi, m_lo into ml (as a double).
inline float mean_split(double mean, double& ml) {
  const MeanSplit m = split_mean(mean);
  ml = static_cast<double>(m.lo);
  return m.hi;
}

// The first pass's Σx (s.sum) to mean = Σx/n and its fp32 pair: returns m_hi, m_lo into ml.
inline float stats_mean(SegmentStats& s, Index n, double& ml) {
  s.mean = s.sum / static_cast<double>(n);
  return mean_split(s.mean, ml);
}

// The second pass's Σe² (sq) and Σdy·e (sge) to M2 = Σe² − n·m_lo² (floored at 0) and Σdy·(x − mean).
template <bool Dy>
inline void stats_finish(SegmentStats& s, Index n, double ml, double sq, double sge) {
  const double m2 = sq - static_cast<double>(n) * ml * ml;
  s.m2 = m2 < 0 ? 0.0 : m2;  // rounding can leave a small negative value; a NaN stays NaN
  s.sdyd = Dy ? sge - ml * s.sdy : 0.0;
}

template <bool Dy>
void stats_impl(SegmentStats* out, const float* x, const float* dy, Index n, const StatsPrefetch& pf) {
  SegmentStats s;
  first_pass<Dy>(x, dy, n, pf, s.sum, s.sdy);
  double ml;
  const float mh = stats_mean(s, n, ml);
  double sq = 0, sge = 0;
  second_pass<Dy>(x, dy, n, bcast(mh), sq, sge);
  stats_finish<Dy>(s, n, ml, sq, sge);
  *out = s;
}

void segment_stats(SegmentStats* out, const float* x, const float* dy, Index n, const StatsPrefetch& pf) {
  if (dy)
    stats_impl<true>(out, x, dy, n, pf);
  else
    stats_impl<false>(out, x, nullptr, n, pf);
}

// stats_impl with dy for a segment whose mean is known (not ±0): Σdy by the first pass (its blocks, without
// Σx), m_hi and m_lo from `mean`, Σdy·e by the second pass (without the squares), so the same operations on
// the same values where mean is stats_impl's Σx/n; sum and m2 are left 0. A mean of ±0 takes stats_impl
// itself: its Σx/n is −0 where Σx is −0, which a mean of +0 (a group's, (0 + Σx)/n) does not tell.
inline void grad_stats_impl(SegmentStats* out, const float* x, const float* dy, Index n, double mean,
                            const StatsPrefetch& pf) {
  if (mean == 0) return stats_impl<true>(out, x, dy, n, pf);
  SegmentStats s;
  first_pass<true, false>(x, dy, n, pf, s.sum, s.sdy);
  s.mean = mean;
  double ml;
  const float mh = mean_split(mean, ml);
  double sq = 0, sge = 0;
  second_pass<true, false>(x, dy, n, bcast(mh), sq, sge);
  s.sdyd = sge - ml * s.sdy;  // stats_finish's
  *out = s;
}

void segment_grad_stats(SegmentStats* out, const float* x, const float* dy, Index n, double mean,
                        const StatsPrefetch& pf) {
  grad_stats_impl(out, x, dy, n, mean, pf);
}

// stats_impl for a segment of one vector or less (1 ≤ n ≤ kF, no prefetch: the first pass has no block of
// 32), its operations written out: the first pass's tail (u = x zero-padded, v = 0: a2 = a3 = +0) and the
// second pass's zero-padded block of 64 (k = {n, 0, 0, 0}: e1..e3 = +0, so t1..t3 = +0), every addition of
// a zero vector kept (x + 0 is not x for x = −0). The same operations on the same values: the same bits.
template <bool Dy>
inline void stats_short(SegmentStats* out, const float* x, const float* dy, Index n) {
  const int k = static_cast<int>(n);
  const VD z = zerod();
  const VF zf = zerof();
  SegmentStats s;
  // Scalar math: sum = Σx (0.0 + each), then as stats_impl
  const VF u = load_n(x, k);
  s.sum = hsum(add(add(add(z, cvt_lo(u)), add(z, cvt_hi(u))), add(z, z)));
  VF g = zf;
  if constexpr (Dy) {
    g = load_n(dy, k);
    s.sdy = hsum(add(add(add(z, cvt_lo(g)), add(z, cvt_hi(g))), add(z, z)));
  }
  double ml;
  const float mh = stats_mean(s, n, ml);
  // Scalar math: e = x − m_hi (0 past n); Σe², Σdy·e as the second pass's zero-padded block
  const VF e = keep_n(sub(u, bcast(mh)), k);
  const VF zz = add(mul(zf, zf), mul(zf, zf));  // t2 + t3 (+0)
  const VF q = add(add(mul(e, e), mul(zf, zf)), zz);
  const double sq = hsum(add(add(z, cvt_lo(q)), add(z, cvt_hi(q))));
  double sge = 0;
  if constexpr (Dy) {
    const VF pr = add(add(mul(g, e), mul(zf, zf)), zz);
    sge = hsum(add(add(z, cvt_lo(pr)), add(z, cvt_hi(pr))));
  }
  stats_finish<Dy>(s, n, ml, sq, sge);
  *out = s;
}

// The hsum tree over lane vectors: lane s = hsum of the vector whose lanes are lane s of v[0..8), that is
// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), for lane terms where v[l] = +0 for l ≥ m and no lane
// of any v[l] is −0 (pair_terms' terms for segments of m < 8 floats). The additions of such a +0 vector are
// left out: x + 0 = x for x not −0, and a sum of two values that are not −0 is not −0 either (a sum is −0
// only when both operands are), so every partial sum the tree would add +0 to is left as it is. m ≥ 8: the
// whole tree.
inline VD hsum_lanes(const VD* v, int m) {
  if (m >= kD) return add(add(add(v[0], v[4]), add(v[2], v[6])), add(add(v[1], v[5]), add(v[3], v[7])));
  VD u[4];  // u[l] = v[l] + v[l + 4]: v[l] alone where v[l + 4] is +0 (l + 4 ≥ m), +0 where both are
  for (int l = 0; l < 4; ++l) u[l] = l + 4 < m ? add(v[l], v[l + 4]) : v[l];
  const VD w0 = m > 2 ? add(u[0], u[2]) : u[0];  // u[2] is +0 unless 2 < m
  const VD w1 = m > 3 ? add(u[1], u[3]) : u[1];
  return m > 1 ? add(w0, w1) : w0;  // w1 is +0 unless 1 < m
}

// The segments that segments_stats takes sixteen at a time (stats_lanes below): n ≤ 40, with or without dy
// (kLanesMax: the lane vectors held, three vectors' worth). Measured on GroupNorm of [N, 256, S]
// (docs/PERFORMANCE.md, "thirty-third session"), against the per-segment kernel: for 17 ≤ S ≤ 31 0.58-0.84 of
// its time (forward and backward), for S = 32 .. 40 0.79-0.89 forward and 0.85-1.01 backward; at S = 44 and
// 48 about as fast forward and 1.07-1.12 times as slow backward, at S = 64 slower still.
inline constexpr int kLanesUpTo = 40, kLanesMax = 3 * kF;

// The lane terms t[l] (l = 0..7) of the horizontal sums over the lane vectors v[0..n) (n ≤ 16) of segments
// 0..7 (h = 0) or 8..15 (h = 1), where the one-segment kernel forms, per segment, lane l of
//   first pass (zero_add):  ((0 + a) + (0 + b)) + (0 + 0)
//   second pass:            (0 + a) + (0 + b)
// with a = double(v[l]), b = double(v[l + 8]), and +0 for the lanes at or past n (the zero fill of the
// padded tail). (For 16 < n ≤ 32 the first pass adds lanes 16..31 too, upper_terms below, and the second
// pass takes v = its fp32 block sums, n = 16.) The additions of +0 that can never change a value are left
// out. In round-to-nearest a sum is −0 only when both operands are −0, so 0 + a is never −0, nor is
// (0 + a) + (0 + b); adding +0 to a value that is not −0 returns that value (a NaN is returned as it is).
// So the first pass's term is (0 + a) + (0 + b) without the last addition, (0 + a) when b is padding, +0
// when both are. The second pass adds fp32 sums of squares e·e and of products dy·e, + 0 (stats_lanes),
// neither ever −0, so there 0 + a = a as well. The tree would then add the +0 terms to values that are not
// −0; hsum_lanes(t, n) leaves those additions out too (n < 8): the same values as the one-segment kernel.
inline void pair_terms(VD* t, const VF* v, int h, int n, bool zero_add) {
  const VD z = zerod();
  for (int l = 0; l < kD; ++l) {
    if (l >= n) {
      t[l] = z;
      continue;
    }
    t[l] = h ? cvt_hi(v[l]) : cvt_lo(v[l]);
    if (zero_add) t[l] = add(z, t[l]);
    if (l + kD < n) {
      VD b = h ? cvt_hi(v[l + kD]) : cvt_lo(v[l + kD]);
      if (zero_add) b = add(z, b);
      t[l] = add(t[l], b);
    }
  }
}

// For 16 < n ≤ 32 the first pass (its zero-padded tail, or for n = 32 one block of 32: the same values)
// forms lane l of four accumulators a_u = 0 + x[8u + l] (u = 0..3, +0 past n) and sums (a0 + a1) +
// (a2 + a3). pair_terms gives a0 + a1 (n = 16 there); this adds a2 + a3, or a2 alone when x[24 + l] is
// padding (a2 + 0 = a2: a2 is never −0), or nothing when both are (+0, added to a value that is not −0).
inline void upper_terms(VD* t, const VF* v, int h, int n) {
  const VD z = zerod();
  auto a = [&](int j) { return add(z, h ? cvt_hi(v[j]) : cvt_lo(v[j])); };  // 0 + x[j]
  for (int l = 0; l < kD && 16 + l < n; ++l)
    t[l] = add(t[l], 24 + l < n ? add(a(16 + l), a(24 + l)) : a(16 + l));
}

// For 32 < n ≤ 48 the first pass takes one block of 32 and then a zero-padded tail: lane l of accumulator u
// holds a_u = (0 + x[8u + l]) + x[32 + 8u + l] (+0 past n, which changes nothing: 0 + x is never −0), and
// it sums (a0 + a1) + (a2 + a3).
template <int Max>
inline void far_terms(VD* t, const VF* v, int h, int n) {
  const VD z = zerod();
  auto c = [&](int j) { return h ? cvt_hi(v[j]) : cvt_lo(v[j]); };
  for (int l = 0; l < kD; ++l) {
    VD a[4];
    for (int u = 0; u < 4; ++u) {
      const int j = 8 * u + l;
      a[u] = add(z, c(j));
      if (j + 32 < n && j + 32 < Max) a[u] = add(a[u], c(j + 32));  // (n ≤ Max)
    }
    t[l] = add(add(a[0], a[1]), add(a[2], a[3]));
  }
}

// The fewest elements that load_lanes transposes rather than gathers, when segments_stats' lane loads say
// transpose: segments shorter than 16 floats from kTransposeMinShort floats on, blocks of the elements past
// the 16th from kTransposeMinTail. The transpose's sixteen loads and 64 permutes cost the same for any
// number of elements, the gathers one per element. On the Zen 5 (GroupNorm of [N, 256, S], the two
// alternated call by call, same bits; docs/PERFORMANCE.md, forty-third session) transposing took 0.84-0.96 of
// the time at S = 3; past the 16th element 1.02-1.07 at S = 17, 18 and 34 (one or two elements), 0.99-1.02 at
// S = 20 (four), 0.94-0.99 at S = 24 (eight).
inline constexpr int kTransposeMinShort = 3, kTransposeMinTail = 5;

// The lane vectors of 16 segments of n floats (segment s at p + s·n, 1 ≤ n ≤ Max ≤ 48): v[j] lane s =
// element j of segment s. For n = 2, 4 and 8 the 16·n floats loaded and deinterleaved in registers (vec.h,
// load_deinterleaved; gathers on the other targets): a gather of 16 floats took 4.7 cycles from L1 on the
// Xeon of docs/PERFORMANCE.md's thirty-fifth session, one or two permutes per vector about 1-2 (n = 8: three
// per vector; on the Zen 5 GroupNorm of [N, 256, 8] took 0.64-0.91 of the time of the transpose below,
// forty-third session; not measured on Intel). For n ≥ 16 the first 16 elements loaded and transposed in
// registers (load_transposed16; gathers on the other targets). The other elements (n < 16 but 2, 4 and 8;
// from the 17th on) as segments_stats' LaneLoads says (channel_kernels.h): one gather per element (Transpose
// false; on the Xeon a second, zero-padded block transposed took 1.2-1.45 of the time at S = 24 and 28: its
// permutes share a port with the conversions to double, a gather's loads do not), or, for enough of them
// (kTransposeMinShort, kTransposeMinTail), sixteen loads and a transpose per sixteen elements
// (load_transposed_n; gathers on the other targets). The same values either way.
template <int Max, bool Transpose>
NL_FORCE_INLINE inline void load_lanes(const float* p, int n, VF* v) {
  // Elements j0 .. j0 + k − 1 of the lane vectors: transposed when Transpose and k ≥ fewest, else gathered.
  const auto block = [&](int j0, int k, int fewest) {
    if (Transpose && k >= fewest) {
      load_transposed_n(p + j0, n, k, kF * n - j0, v + j0);
    } else {
      for (int j = j0; j < j0 + k; ++j) v[j] = gather(p + j, n);
    }
  };
  if (n < kF) {
    if (n == 2) return load_deinterleaved<2>(p, v);
    if (n == 4) return load_deinterleaved<4>(p, v);
    if (n == 8) return load_deinterleaved<8>(p, v);
    return block(0, n, kTransposeMinShort);
  }
  load_transposed16(p, n, v);
  if constexpr (Max > kF)
    for (int j0 = kF; j0 < n; j0 += kF) block(j0, std::min(n - j0, kF), kTransposeMinTail);
}

// The first pass's lane terms for the segments that stats_lanes<Max> takes: n ≤ 16, 16 < n ≤ 32, 32 < n ≤ 48.
template <int Max>
inline void first_terms(VD* t, const VF* v, int h, int n) {
  if constexpr (Max > 2 * kF) {
    far_terms<Max>(t, v, h, n);
  } else {
    pair_terms(t, v, h, std::min(n, kF), true);
    if constexpr (Max > kF) upper_terms(t, v, h, n);
  }
}

// stats_impl (stats_short for n ≤ 16) of 16 segments at once, segment s (x + s·n, dy + s·n; 1 ≤ n ≤ Max) in
// lane s: element j of the segments in the lane vector xs[j] (load_lanes), and each of the per-segment
// operations on lane l of a segment's vector done on the vector of that lane across the segments, in
// doubles for segments 0..7 (h = 0) and 8..15 (h = 1); a horizontal sum becomes hsum_lanes over lane terms
// (first_terms), which leave out the additions of +0 that never change a value. The same values
// as segment_stats segment by segment: the same bits (tests/norm/channel_kernels_test.cpp).
// Known (with Dy): the sixteen segments' means given (means[0..16), none ±0; grad_stats_impl): no Σx and no
// squares; mean, sdy and sdyd stored, as grad_stats_impl forms them segment by segment.
template <bool Dy, int Max, bool Transpose, bool Known = false>
inline void stats_lanes(const SegmentColumns& out, Index at, const float* x, const float* dy, Index n,
                        const double* means = nullptr) {
  static_assert(Dy || !Known);
  const int k = static_cast<int>(std::min<Index>(n, Max));  // (n ≤ Max: the bound, for the compiler)
  const int nb = std::min(k, kF);  // the lanes of one vector; the second pass's block sums
  const VF zf = zerof();
  VF xs[Max], gs[Max];
  load_lanes<Max, Transpose>(x, k, xs);
  if constexpr (Dy) load_lanes<Max, Transpose>(dy, k, gs);
  const VD nd = bcastd(static_cast<double>(n));
  VD t[kD], sum[2], sdy[2], mean[2], ml[2];
  for (int h = 0; h < 2; ++h) {
    // Scalar math: per segment, sum = Σx (the first pass: first_terms), mean = sum / n (likewise Σdy)
    if constexpr (!Known) {
      first_terms<Max>(t, xs, h, k);
      sum[h] = hsum_lanes(t, k);
    }
    if constexpr (Dy) {
      first_terms<Max>(t, gs, h, k);
      sdy[h] = hsum_lanes(t, k);
    }
    if constexpr (Known)
      mean[h] = loadd(means + h * kD);
    else
      mean[h] = div(sum[h], nd);
  }
  // Scalar math: m_hi = float(mean), m_lo = double(float(mean − double(m_hi)))
  const VF mh = narrow_pd(mean[0], mean[1]);
  const VF mlf = narrow_pd(sub(mean[0], cvt_lo(mh)), sub(mean[1], cvt_hi(mh)));
  ml[0] = cvt_lo(mlf);
  ml[1] = cvt_hi(mlf);
  // Scalar math: e = x − m_hi; per segment the second pass's zero-padded block of 64 (e = +0 past n; for
  // n ≤ 48 its vector 3 is all padding), lane j of its fp32 block sum (e²[j] + e²[16 + j]) + (e²[32 + j] +
  // 0), likewise dy·e. A square is never −0, so the +0 terms change nothing and are left out (as are the
  // squares past n). A product can be −0: there the block's sum is (the products that are there) + 0 (for
  // a suffix of +0 terms each case of the tree works out to that), and the accumulator's 0 + adds +0 once
  // more (idempotent), so a product sum is never −0.
  VF q[kF], pr[kF];
  for (int j = 0; j < nb; ++j) {
    const VF e = sub(xs[j], mh);
    if constexpr (!Known) q[j] = mul(e, e);
    if constexpr (Dy) pr[j] = mul(gs[j], e);
    if (Max > kF && j + kF < k) {
      const VF e1 = sub(xs[j + kF], mh);
      if constexpr (!Known) q[j] = add(q[j], mul(e1, e1));
      if constexpr (Dy) pr[j] = add(pr[j], mul(gs[j + kF], e1));
    }
    if (Max > 2 * kF && j + 2 * kF < k) {
      const VF e2 = sub(xs[j + 2 * kF], mh);
      if constexpr (!Known) q[j] = add(q[j], mul(e2, e2));
      if constexpr (Dy) pr[j] = add(pr[j], mul(gs[j + 2 * kF], e2));
    }
    if constexpr (Dy) pr[j] = add(pr[j], zf);
  }
  for (int h = 0; h < 2; ++h) {
    const Index o = at + h * kD;
    // Scalar math: M2 = Σe² − n·m_lo·m_lo floored at 0; Σdy·(x − mean) = Σdy·e − m_lo·Σdy
    if constexpr (!Known) {
      pair_terms(t, q, h, nb, false);
      stored(out.sum + o, sum[h]);
      stored(out.m2 + o, floor0(sub(hsum_lanes(t, nb), mul(mul(nd, ml[h]), ml[h]))));
    }
    stored(out.mean + o, mean[h]);
    if constexpr (Dy) {
      pair_terms(t, pr, h, nb, false);
      stored(out.sdy + o, sdy[h]);
      stored(out.sdyd + o, sub(hsum_lanes(t, nb), mul(ml[h], sdy[h])));
    }
  }
}

// segments_stats' sixteens of segments (n ≤ kLanesUpTo): the first count − count % 16 segments; returns
// that count.
template <bool Transpose>
Index stats_sixteens(const SegmentColumns& out, const float* x, const float* dy, Index n, Index count) {
  Index i = 0;
  for (; i + kF <= count; i += kF) {
    if (n <= kF) {
      if (dy)
        stats_lanes<true, kF, Transpose>(out, i, x + i * n, dy + i * n, n);
      else
        stats_lanes<false, kF, Transpose>(out, i, x + i * n, nullptr, n);
    } else if (n <= 2 * kF) {
      if (dy)
        stats_lanes<true, 2 * kF, Transpose>(out, i, x + i * n, dy + i * n, n);
      else
        stats_lanes<false, 2 * kF, Transpose>(out, i, x + i * n, nullptr, n);
    } else if (dy) {
      stats_lanes<true, kLanesMax, Transpose>(out, i, x + i * n, dy + i * n, n);
    } else {
      stats_lanes<false, kLanesMax, Transpose>(out, i, x + i * n, nullptr, n);
    }
  }
  return i;
}

void segments_stats(const SegmentColumns& out, const float* x, const float* dy, Index n, Index count,
                    LaneLoads loads) {
  const StatsPrefetch pf;  // segment_stats' default: follow x in memory (into the next segments)
  // Scalar math: segment_stats(x + i·n, dy + i·n, n) into the columns' entry i, for i in [0, count)
  Index i = 0;
  if (n <= kLanesUpTo) {
#if NL_VEC_AVX512
    i = loads == LaneLoads::kTranspose ? stats_sixteens<true>(out, x, dy, n, count)
                                       : stats_sixteens<false>(out, x, dy, n, count);
#else
    (void)loads;  // gathers either way (load_transposed_n gathers on these targets)
    i = stats_sixteens<false>(out, x, dy, n, count);
#endif
  }
  SegmentStats s;
  for (; i < count; ++i) {
    if (n <= kF) {
      if (dy)
        stats_short<true>(&s, x + i * n, dy + i * n, n);
      else
        stats_short<false>(&s, x + i * n, nullptr, n);
    } else if (dy) {
      stats_impl<true>(&s, x + i * n, dy + i * n, n, pf);
    } else {
      stats_impl<false>(&s, x + i * n, nullptr, n, pf);
    }
    put(out, i, s, dy);
  }
}

// stats_sixteens with dy and the segments' means known (means[i] for segment i): each sixteen whose means
// are none ±0 without Σx and the squares (stats_lanes' Known), the others as stats_sixteens forms them.
template <bool Transpose>
Index grad_stats_sixteens(const SegmentColumns& out, const float* x, const float* dy, Index n, Index count,
                          const double* means) {
  Index i = 0;
  for (; i + kF <= count; i += kF) {
    bool known = true;
    for (int l = 0; l < kF; ++l) known = known && means[i + l] != 0;
    const float* xi = x + i * n;
    const float* dyi = dy + i * n;
    if (n <= kF) {
      if (known)
        stats_lanes<true, kF, Transpose, true>(out, i, xi, dyi, n, means + i);
      else
        stats_lanes<true, kF, Transpose>(out, i, xi, dyi, n);
    } else if (n <= 2 * kF) {
      if (known)
        stats_lanes<true, 2 * kF, Transpose, true>(out, i, xi, dyi, n, means + i);
      else
        stats_lanes<true, 2 * kF, Transpose>(out, i, xi, dyi, n);
    } else if (known) {
      stats_lanes<true, kLanesMax, Transpose, true>(out, i, xi, dyi, n, means + i);
    } else {
      stats_lanes<true, kLanesMax, Transpose>(out, i, xi, dyi, n);
    }
  }
  return i;
}

void segments_grad_stats(const SegmentColumns& out, const float* x, const float* dy, Index n, Index count,
                         const double* means, LaneLoads loads) {
  const StatsPrefetch pf;  // segments_stats'
  // Scalar math: segment_grad_stats(x + i·n, dy + i·n, n, means[i]) into the columns' entry i
  Index i = 0;
  if (n <= kLanesUpTo) {
#if NL_VEC_AVX512
    i = loads == LaneLoads::kTranspose ? grad_stats_sixteens<true>(out, x, dy, n, count, means)
                                       : grad_stats_sixteens<false>(out, x, dy, n, count, means);
#else
    (void)loads;
    i = grad_stats_sixteens<false>(out, x, dy, n, count, means);
#endif
  }
  SegmentStats s;
  for (; i < count; ++i) {
    grad_stats_impl(&s, x + i * n, dy + i * n, n, means[i], pf);
    put(out, i, s);
  }
}

// out[i] = f(i, k) for blocks of kF elements (k valid lanes; only those are stored). With stream, the
// blocks from the first 64-byte boundary of out on are non-temporal stores, the head before it and the
// tail ordinary (masked) stores: a different split, the same lane-wise values.
template <typename F>
inline void elementwise(float* out, Index n, bool use_stream, F&& f) {
  Index i = 0;
  if (use_stream) {
    const Index head =
        std::min<Index>(n, static_cast<Index>((64 - (reinterpret_cast<std::uintptr_t>(out) & 63)) & 63) / 4);
    if (head > 0) {
      store_n(out, f(0, static_cast<int>(head)), static_cast<int>(head));
      i = head;
    }
    for (; i + kF <= n; i += kF) stream(out + i, f(i, kF));
  } else {
    for (; i + kF <= n; i += kF) store(out + i, f(i, kF));
  }
  if (i < n) {
    const int k = static_cast<int>(n - i);
    store_n(out + i, f(i, k), k);
  }
}

// The channel norms' two elementwise formulas, in fp32 (every elementwise path below forms its outputs with
// these, whatever the source of its constants):
//   normalized:     ((x − mh) − ml)·s + b
//   input_gradient: r·((dy·w − c0) − ((x − mh) − ml)·c2)
NL_FORCE_INLINE inline VF normalized(VF x, VF mh, VF ml, VF s, VF b) {
  return add(mul(sub(sub(x, mh), ml), s), b);
}
NL_FORCE_INLINE inline VF input_gradient(VF x, VF dy, VF mh, VF ml, VF r, VF w, VF c0, VF c2) {
  const VF d = sub(sub(x, mh), ml);
  return mul(r, sub(sub(mul(dy, w), c0), mul(d, c2)));
}

void normalize(float* y, const float* x, Index n, const NormalizeConsts& c, bool use_stream) {
  const VF mh = bcast(c.mh), ml = bcast(c.ml), s = bcast(c.s), b = bcast(c.b);
  // Scalar math: y[i] = ((x[i] − mh) − ml)·s + b, all in fp32
  elementwise(y, n, use_stream, [&](Index i, int k) { return normalized(load_k(x, i, k), mh, ml, s, b); });
}

void input_grad(float* dx, const float* dy, const float* x, Index n, const InputGradConsts& c,
                bool use_stream) {
  const VF mh = bcast(c.mh), ml = bcast(c.ml), r = bcast(c.r), w = bcast(c.w), c0 = bcast(c.c0),
           c2 = bcast(c.c2);
  // Scalar math: dx[i] = r·((dy[i]·w − c0) − ((x[i] − mh) − ml)·c2), all in fp32
  elementwise(dx, n, use_stream, [&](Index i, int k) {
    return input_gradient(load_k(x, i, k), load_k(dy, i, k), mh, ml, r, w, c0, c2);
  });
}

// The lane selectors of a run of segments of n floats: lane l of a vector whose first element is element r
// of segment 0 lies in segment (r + l) / n. kRunLanes[n][r] for n ≤ kF (16 lanes span at most 16
// segments); for n > kF at most two, and lane l is in segment 1 when l ≥ n − r: kRunStep[min(n − r, kF)].
inline constexpr auto kRunLanes = [] {
  std::array<std::array<std::array<std::uint8_t, kF>, kF>, kF + 1> t{};
  for (int n = 1; n <= kF; ++n)
    for (int r = 0; r < n; ++r)
      for (int l = 0; l < kF; ++l) t[n][r][l] = static_cast<std::uint8_t>((r + l) / n);
  return t;
}();
inline constexpr auto kRunStep = [] {
  std::array<std::array<std::uint8_t, kF>, kF + 1> t{};
  for (int b = 0; b <= kF; ++b)
    for (int l = 0; l < kF; ++l) t[b][l] = l >= b ? 1 : 0;
  return t;
}();
inline const std::uint8_t* run_lanes(Index n, Index r) {
  if (n <= kF) return kRunLanes[static_cast<std::size_t>(n)][static_cast<std::size_t>(r)].data();
  return kRunStep[static_cast<std::size_t>(std::min<Index>(n - r, kF))].data();
}

// The vector of per-segment values a[s + lanes[l]] (a holds count entries; only those are read).
inline VF segment_lanes(const float* a, Index s, Index count, VI lanes) {
  return pick(count - s >= kF ? load(a + s) : load_n(a + s, static_cast<int>(count - s)), lanes);
}

// Whether segments_normalize / segments_input_grad go through the run as one stream of vectors (else segment
// by segment): for n < kF; and for n = 16, 32, 64 when streaming to an output that is not 64-byte aligned,
// where each segment's partial first and last lines (ordinary stores) cost GroupNorm of [N, 256, n] 1.1-1.4
// times the time of the run's vectors (outputs 16 or 32 bytes past a line; those lines then lie a power
// of two apart, in a fraction of the cache's sets, perhaps why n = 48 does not show it). Aligned, or not
// streamed, the segments one by one were as fast or faster from n = 16 on (docs/PERFORMANCE.md,
// thirty-fourth session).
inline bool on_run_vectors(Index n, const float* out, bool use_stream) {
  if (n < kF) return true;
  return use_stream && (n == kF || n == 2 * kF || n == 4 * kF) &&
         (reinterpret_cast<std::uintptr_t>(out) & 63) != 0;
}

// out[i] for i in [0, count·n) of `count` consecutive segments of n floats, as elementwise() forms
// it: f(i, k, s, lanes), where element i is in segment s and lane l in segment s + lanes[l]. The blocks
// after the first go kF elements on (s, r advanced without a division); a streamed run's head is shorter.
template <typename F>
inline void run_elementwise(float* out, Index n, Index count, bool use_stream, F&& f) {
  const Index step_s = kF / n, step_r = kF % n;
  Index next = 0, s = 0, r = 0;  // the block expected next, its segment, its offset in that segment
  elementwise(out, n * count, use_stream, [&](Index i, int k) {
    if (i != next) {
      s = i / n;
      r = i - s * n;
    }
    const VF v = f(i, k, s, load_idx(run_lanes(n, r)));
    next = i + kF;
    s += step_s;
    r += step_r;
    if (r >= n) {
      r -= n;
      ++s;
    }
    return v;
  });
}

// Segments of n < kF floats (and the cases of on_run_vectors) go through the run as one stream of vectors,
// each lane with its segment's constants (pick): the per-segment calls (a masked vector or two per segment,
// four or six broadcasts each) took most of GroupNorm's elementwise time at S = 4 and 8 (docs/PERFORMANCE.md,
// thirty-fourth session). Every element's value is normalize's / input_grad's.
void segments_normalize(float* y, const float* x, Index n, Index count, const RowNormalizeConsts& k,
                        bool use_stream) {
  if (on_run_vectors(n, y, use_stream)) {
    // Scalar math: y[i] = ((x[i] − mh_s) − ml_s)·s_s + b_s, s the segment of element i, all in fp32
    run_elementwise(y, n, count, use_stream, [&](Index i, int kk, Index s, VI lanes) {
      const VF mh = segment_lanes(k.mh, s, count, lanes), ml = segment_lanes(k.ml, s, count, lanes),
               sc = segment_lanes(k.s, s, count, lanes), b = segment_lanes(k.b, s, count, lanes);
      return normalized(load_k(x, i, kk), mh, ml, sc, b);
    });
    return;
  }
  if (n == kF) {
    // One vector per segment (64-byte aligned where streamed: else on_run_vectors), the stores normalize()
    // makes, without a call per segment.
    // Scalar math: y[i·16 + j] = ((x[i·16 + j] − mh_i) − ml_i)·s_i + b_i, all in fp32
    for (Index i = 0; i < count; ++i) {
      const VF v = normalized(load(x + i * kF), bcast(k.mh[i]), bcast(k.ml[i]), bcast(k.s[i]), bcast(k.b[i]));
      if (use_stream)
        stream(y + i * kF, v);
      else
        store(y + i * kF, v);
    }
    return;
  }
  // Scalar math: normalize(y + i·n, x + i·n, n, segment i's constants) for i in [0, count)
  for (Index i = 0; i < count; ++i)
    normalize(y + i * n, x + i * n, n, NormalizeConsts{k.mh[i], k.ml[i], k.s[i], k.b[i]}, use_stream);
}

void segments_input_grad(float* dx, const float* dy, const float* x, Index n, Index count,
                         const RowInputGradConsts& k, bool use_stream) {
  if (on_run_vectors(n, dx, use_stream)) {
    // Scalar math: dx[i] = r_s·((dy[i]·w_s − c0_s) − ((x[i] − mh_s) − ml_s)·c2_s), s the segment of element
    // i, all in fp32
    run_elementwise(dx, n, count, use_stream, [&](Index i, int kk, Index s, VI lanes) {
      const VF mh = segment_lanes(k.mh, s, count, lanes), ml = segment_lanes(k.ml, s, count, lanes);
      const VF w = segment_lanes(k.w, s, count, lanes), c0 = segment_lanes(k.c0, s, count, lanes),
               c2 = segment_lanes(k.c2, s, count, lanes), r = segment_lanes(k.r, s, count, lanes);
      return input_gradient(load_k(x, i, kk), load_k(dy, i, kk), mh, ml, r, w, c0, c2);
    });
    return;
  }
  if (n == kF) {
    // As segments_normalize's.
    // Scalar math: dx[i·16 + j] = r_i·((dy[i·16 + j]·w_i − c0_i) − ((x[i·16 + j] − mh_i) − ml_i)·c2_i), fp32
    for (Index i = 0; i < count; ++i) {
      const VF v = input_gradient(load(x + i * kF), load(dy + i * kF), bcast(k.mh[i]), bcast(k.ml[i]),
                                  bcast(k.r[i]), bcast(k.w[i]), bcast(k.c0[i]), bcast(k.c2[i]));
      if (use_stream)
        stream(dx + i * kF, v);
      else
        store(dx + i * kF, v);
    }
    return;
  }
  // Scalar math: input_grad(dx + i·n, dy + i·n, x + i·n, n, segment i's constants) for i in [0, count)
  for (Index i = 0; i < count; ++i)
    input_grad(dx + i * n, dy + i * n, x + i * n, n,
               InputGradConsts{k.mh[i], k.ml[i], k.r[i], k.w[i], k.c0[i], k.c2[i]}, use_stream);
}

void fence() {
  stream_fence();
}

// ---- channel rows (channel_kernels.h) ----------------------------------------------------------------

// How many rows ahead the channel-rows kernels prefetch their inputs' lines (x, dy). With two threads
// each sweeping half of every row the hardware prefetchers fall behind: BatchNorm's backward on
// [64, 400, 256] channels-last took 9.8 ms at 2 threads without, 5.9 with (docs/PERFORMANCE.md,
// twenty-ninth session); 1 thread the same either way.
inline constexpr Index kRowsAhead = 8;

// f(row r, channel i, k valid lanes) for every block of kF channels of every row, rows outer; prefetching
// the inputs' lines of row r + kRowsAhead.
template <typename F>
inline void each_row_block(const ChannelRows& a, F&& f) {
  const Index lines = (a.nc * Index{sizeof(float)} + 63) / 64;
  for (Index r = 0; r < a.rows; ++r) {
    if (r + kRowsAhead < a.rows) {
      if (a.x) prefetch_lines(reinterpret_cast<std::uintptr_t>(a.x + a.xo[r + kRowsAhead]), lines);
      if (a.dy) prefetch_lines(reinterpret_cast<std::uintptr_t>(a.dy + a.dyo[r + kRowsAhead]), lines);
    }
    Index i = 0;
    for (; i + kF <= a.nc; i += kF) f(r, i, kF);
    if (i < a.nc) f(r, i, static_cast<int>(a.nc - i));
  }
}

// Zeroes the per-channel sums p[0 .. nc rounded up to kF) (the arrays' padding, channel_kernels.h).
inline void zero_sums(double* p, Index nc) {
  for (Index i = 0; i < nc; i += kF) {
    stored(p + i, zerod());
    stored(p + i + kD, zerod());
  }
}

void rows_sum(double* sum, const ChannelRows& a) {
  zero_sums(sum, a.nc);
  // Scalar math: sum[c] += double(x[r][c]), r in order
  each_row_block(a, [&](Index r, Index i, int k) {
    const VF v = load_k(a.x + a.xo[r], i, k);
    stored(sum + i, add(loadd(sum + i), cvt_lo(v)));
    stored(sum + i + kD, add(loadd(sum + i + kD), cvt_hi(v)));
  });
}

void rows_sqdev(double* q, const double* mean, const ChannelRows& a) {
  zero_sums(q, a.nc);
  // Scalar math: d = double(x[r][c]) − mean[c]; q[c] += d·d, r in order
  each_row_block(a, [&](Index r, Index i, int k) {
    const VF v = load_k(a.x + a.xo[r], i, k);
    const VD d0 = sub(cvt_lo(v), loadd(mean + i)), d1 = sub(cvt_hi(v), loadd(mean + i + kD));
    stored(q + i, add(loadd(q + i), mul(d0, d0)));
    stored(q + i + kD, add(loadd(q + i + kD), mul(d1, d1)));
  });
}

void rows_grads(const RowGradSums& g, const double* mean, const double* rstd, const double* w,
                const ChannelRows& a) {
  const bool means = g.mg != nullptr;
  for (double* p : {g.mg, g.mgx, g.dw, g.db})
    if (p) zero_sums(p, a.nc);
  const VD one = bcastd(1.0);
  // Scalar math: sdy = double(dy[r][c]); sdyxh = rstd[c]·(0 + (double(x[r][c]) − mean[c])·sdy);
  //   mg[c] += w[c]·sdy; mgx[c] += w[c]·sdyxh; dw[c] += sdyxh; db[c] += sdy, r in order
  each_row_block(a, [&](Index r, Index i, int k) {
    const VF xv = load_k(a.x + a.xo[r], i, k), dyv = load_k(a.dy + a.dyo[r], i, k);
    for (int h = 0; h < 2; ++h) {
      const Index j = i + h * kD;
      const VD sdy = h ? cvt_hi(dyv) : cvt_lo(dyv);
      const VD d = sub(h ? cvt_hi(xv) : cvt_lo(xv), loadd(mean + j));
      const VD sdyxh = mul(loadd(rstd + j), add(zerod(), mul(d, sdy)));
      stored(g.dw + j, add(loadd(g.dw + j), sdyxh));
      stored(g.db + j, add(loadd(g.db + j), sdy));
      if (means) {
        const VD wv = w ? loadd(w + j) : one;
        stored(g.mg + j, add(loadd(g.mg + j), mul(wv, sdy)));
        stored(g.mgx + j, add(loadd(g.mgx + j), mul(wv, sdyxh)));
      }
    }
  });
}

// out[r][i..i+k) = f(r, i, k) for every row, streamed where use_stream and the row's block is a whole
// aligned vector, else ordinary (masked) stores: the same lane-wise values either way.
template <typename F>
inline void rows_elementwise(const ChannelRows& a, bool use_stream, F&& f) {
  each_row_block(a, [&](Index r, Index i, int k) {
    float* o = a.out + a.oo[r] + i;
    const VF v = f(r, i, k);
    if (k < kF)
      store_n(o, v, k);
    else if (use_stream && (reinterpret_cast<std::uintptr_t>(o) & 63) == 0)
      stream(o, v);
    else
      store(o, v);
  });
}

void rows_normalize(const RowNormalizeConsts& c, const ChannelRows& a, bool use_stream) {
  // Scalar math: out[r][c] = ((x[r][c] − mh[c]) − ml[c])·s[c] + b[c], all in fp32
  rows_elementwise(a, use_stream, [&](Index r, Index i, int k) {
    return normalized(load_k(a.x + a.xo[r], i, k), load(c.mh + i), load(c.ml + i), load(c.s + i),
                      load(c.b + i));
  });
}

void rows_input_grad(const RowInputGradConsts& c, const ChannelRows& a, bool use_stream) {
  // Scalar math: out[r][c] = r[c]·((dy[r][c]·w[c] − c0[c]) − ((x[r][c] − mh[c]) − ml[c])·c2[c]), fp32
  rows_elementwise(a, use_stream, [&](Index r, Index i, int k) {
    return input_gradient(load_k(a.x + a.xo[r], i, k), load_k(a.dy + a.dyo[r], i, k), load(c.mh + i),
                          load(c.ml + i), load(c.r + i), load(c.w + i), load(c.c0 + i), load(c.c2 + i));
  });
}

// ---- single-element segments (channel_kernels.h) ----------------------------------------------------

// The segment statistics of one element per lane, as segment_stats forms them for n = 1 (see
// channel_kernels.h, "Terms of single-element segments"): mean_s (= Σx = 0 + x), m_lo, and e = x − m_hi for
// the 8 lanes of xd (double) and xf (the same values in fp32, lanes 0..7 of a VF).
struct SingleLanes {
  VD mean, ml;
  VF e;  // lanes 0..7
};
inline SingleLanes single_lanes(VD xd, VF xf) {
  SingleLanes s;
  s.mean = add(zerod(), xd);
  const VF mh = narrow_pd(s.mean, zerod());  // lanes 0..7
  const VD mhd = cvt_lo(mh);
  s.ml = cvt_lo(narrow_pd(sub(s.mean, mhd), zerod()));
  s.e = sub(xf, mh);
  return s;
}

// f(i, h, xd, xf) for each half h (8 channels from i + 8h) of every block of 16 channels: xd the channels
// in double, xf their floats in lanes 0..7 (zero past n).
template <typename F>
inline void each_half(const float* x, Index n, F&& f) {
  for (Index i = 0; i < n; i += kF) {
    const VF v = load_k(x, i, static_cast<int>(std::min<Index>(kF, n - i)));
    f(i, 0, cvt_lo(v), v);
    f(i, 1, cvt_hi(v), narrow_pd(cvt_hi(v), zerod()));
  }
}

// gatherd, scatterd and gather_cvt of the entries of eight groups stride apart (the sample rows' and runs'
// kernels below), as plain vector loads and stores where they are consecutive (stride 1: one segment per
// group, InstanceNorm): the same values. On the Zen 5 (docs/PERFORMANCE.md, "forty-ninth session") run_grads
// with gathers and a scatter of eight doubles took 12 % of InstanceNorm's backward from saved statistics at
// [1024, 256, 16] (perf), 8 % with the loads; InstanceNorm of [N, 256, S] took 0.80-0.91 of the time at 2
// threads (forward, backward, from saved statistics) with S = 8 and 16, 0.95-0.97 with S = 64 (processes
// alternating; 1 thread too noisy to tell: medians 0.70-0.82 and 1.0).
inline VD column_load(const double* p, Index stride) {
  return stride == 1 ? loadd(p) : gatherd(p, stride);
}
inline void column_store(double* p, Index stride, VD a) {
  if (stride == 1)
    stored(p, a);
  else
    scatterd(p, stride, a);
}
inline VD column_cvt(const float* p, Index stride) {
  return stride == 1 ? load_cvt(p) : gather_cvt(p, stride);
}

// f(j, xd) for j = 0 .. spg − 1 in order, xd lane l = double(xg[l·spg + j]): the channels of eight groups
// of spg floats at xg, eight channels at a time from columns of 8x8 blocks (load_cols8_cvt), the last
// spg mod 8 by gathers.
template <typename F>
NL_FORCE_INLINE inline void each_channel8(const float* xg, Index spg, F&& f) {
  Index j = 0;
  for (; j + 8 <= spg; j += 8) {
    VD t[8];
    load_cols8_cvt(t, xg + j, spg);
    for (int k = 0; k < 8; ++k) f(j + k, t[k]);
  }
  for (; j < spg; ++j) f(j, column_cvt(xg + j, spg));
}

// The moments of a sample row's groups (channel_kernels.h): eight groups at a time, group g + l in lane l
// (its channel j at x + (g + l)·spg + j: each_channel8), the groups past the last full block one by one
// in scalar code with the same operations.
void single_moments(double* mean, double* var, double* rstd, const float* x, Index spg, Index groups,
                    double count, double eps) {
  const VD vcount = bcastd(count), veps = bcastd(eps), one = bcastd(1.0);
  Index g = 0;
  // Scalar math: mean_s = 0 + x; m = (Σ_j mean_s) / count; e = x − float(mean_s);
  //   m_lo = float(mean_s − float(mean_s)); u = (double(e·e) − m_lo·m_lo) + d·d, d = mean_s − m;
  //   var = (Σ_j u) / count; rstd = 1/√(var + eps) (count 0: all 0)
  for (; g + kD <= groups; g += kD) {
    const float* const xg = x + g * spg;
    VD m = zerod();
    each_channel8(xg, spg, [&](Index, VD xd) NL_FORCE_INLINE { m = add(m, add(zerod(), xd)); });
    m = count > 0 ? div(m, vcount) : zerod();
    // Every mean finite: so is every x of these groups (a double sum of at most 2^63 floats cannot
    // overflow), and then mean_s = x (+0 for −0), e = m_lo = +0, M2 = +0 − +0·+0 = +0 and u = +0 + d·d is
    // d·d (never −0): the terms without M2, the same values.
    alignas(64) double means[kD];
    stored(means, m);
    bool finite = true;
    for (int l = 0; l < kD; ++l) finite = finite && std::isfinite(means[l]);
    VD v = zerod();
    if (finite) {
      each_channel8(xg, spg, [&](Index, VD xd) NL_FORCE_INLINE {
        const VD d = sub(add(zerod(), xd), m);
        v = add(v, mul(d, d));
      });
    } else {
      each_channel8(xg, spg, [&](Index, VD xd) NL_FORCE_INLINE {
        const SingleLanes s = single_lanes(xd, narrow_pd(xd, zerod()));
        const VD m2 = sub(cvt_lo(mul(s.e, s.e)), mul(s.ml, s.ml));
        const VD d = sub(s.mean, m);
        v = add(v, add(m2, mul(d, d)));
      });
    }
    v = count > 0 ? div(v, vcount) : zerod();
    stored(mean + g, m);
    stored(var + g, v);
    stored(rstd + g, count > 0 ? div(one, sqrtd(add(v, veps))) : zerod());
  }
  for (; g < groups; ++g) {
    const float* const xg = x + g * spg;
    double m = 0.0;
    for (Index j = 0; j < spg; ++j) m += 0.0 + static_cast<double>(xg[j]);
    m = count > 0 ? m / count : 0.0;
    double v = 0.0;
    for (Index j = 0; j < spg; ++j) {
      const double ms = 0.0 + static_cast<double>(xg[j]);
      double ml;
      const float mh = mean_split(ms, ml);
      const float e = xg[j] - mh;
      const double d = ms - m;
      v += (static_cast<double>(e * e) - ml * ml) + d * d;
    }
    v = count > 0 ? v / count : 0.0;
    mean[g] = m;
    var[g] = v;
    rstd[g] = count > 0 ? 1.0 / std::sqrt(v + eps) : 0.0;
  }
}

// out[g·spg + j] = v[g] (channel_kernels.h): each group's value broadcast, 16 floats / 8 doubles at a time.
// A group's last partial vector is stored whole where that stays within the spg·groups entries (the later
// groups' stores overwrite what it writes past its group); else its tail goes one by one.
template <typename T>
void spread_values(T* out, const T* v, Index spg, Index groups) {
  constexpr Index kW = std::is_same_v<T, float> ? kF : kD;
  for (Index g = 0; g < groups; ++g) {
    // Scalar math: out[g·spg + j] = v[g]
    auto put = [&](T* p) NL_FORCE_INLINE {
      if constexpr (std::is_same_v<T, float>)
        store(p, bcast(v[g]));
      else
        stored(p, bcastd(v[g]));
    };
    T* const o = out + g * spg;
    Index j = 0;
    for (; j + kW <= spg; j += kW) put(o + j);
    if (j < spg && g * spg + j + kW <= spg * groups) {
      put(o + j);
    } else {
      for (; j < spg; ++j) o[j] = v[g];
    }
  }
}
void spread_groups(float* out, const float* v, Index spg, Index groups) {
  spread_values(out, v, spg, groups);
}
void spread_groupsd(double* out, const double* v, Index spg, Index groups) {
  spread_values(out, v, spg, groups);
}

// The most channels per group whose constants single_normalize_consts and single_input_grad_consts store
// one by one: with two or three channels per group a group's vector stores took GroupNorm's forward on
// sample runs ([1024, 256, 16], 128 groups; [1024, 255, 16] and [512, 255, 32], 85 groups) 1.01-1.05 times
// as long at 1 thread as scalar stores; at four ([256, 256, 64], 64 groups) and eight ([512, 256, 49])
// about as long (docs/PERFORMANCE.md, forty-seventh session).
inline constexpr Index kScalarConstsUpTo = 3;

// The fp32 pairs of sixteen means: mh[i] = float(mean[i]), ml[i] = float(mean[i] − double(mh[i])).
inline void store_mean_pairs(float* mh, float* ml, const double* mean) {
  const VD m0 = loadd(mean), m1 = loadd(mean + kD);
  const VF h = narrow_pd(m0, m1);
  store(mh, h);
  store(ml, narrow_pd(sub(m0, cvt_lo(h)), sub(m1, cvt_hi(h))));
}

// The per-channel constants of a sample row's normalize pass (channel_kernels.h): one channel per group
// sixteen groups per vector, up to kScalarConstsUpTo channels per group one by one, more group by group, 16
// channels at a time.
void single_normalize_consts(float* mh, float* ml, float* s, const double* mean, const double* rstd,
                             const float* w, Index spg, Index groups) {
  Index g = 0;
  if (spg == 1) {
    // One channel per group (InstanceNorm): sixteen groups per vector, the same operations.
    // Scalar math: mh[g] = float(mean_g); ml[g] = float(mean_g − double(mh[g])); s[g] =
    //   float(rstd_g·double(w[g])) (w null: float(rstd_g)); the last groups % 16 in the loop below
    for (; g + kF <= groups; g += kF) {
      store_mean_pairs(mh + g, ml + g, mean + g);
      const VD r0 = loadd(rstd + g), r1 = loadd(rstd + g + kD);
      if (w) {
        const VF wv = load(w + g);
        store(s + g, narrow_pd(mul(r0, cvt_lo(wv)), mul(r1, cvt_hi(wv))));
      } else {
        store(s + g, narrow_pd(r0, r1));
      }
    }
  }
  if (spg <= kScalarConstsUpTo) {
    for (; g < groups; ++g) {
      const float h = static_cast<float>(mean[g]), l = static_cast<float>(mean[g] - static_cast<double>(h));
      for (Index c = g * spg; c < (g + 1) * spg; ++c) {
        mh[c] = h;
        ml[c] = l;
        s[c] = static_cast<float>(rstd[g] * (w ? static_cast<double>(w[c]) : 1.0));
      }
    }
  }
  for (; g < groups; ++g) {
    // Scalar math: mh[c] = float(mean_g); ml[c] = float(mean_g − mh[c]); s[c] = float(rstd_g·double(w[c]))
    //   (w null: float(rstd_g)), for c = g·spg + j
    const float h = static_cast<float>(mean[g]);
    const VF vh = bcast(h), vl = bcast(static_cast<float>(mean[g] - static_cast<double>(h)));
    const VD r = bcastd(rstd[g]);
    const VF r1 = bcast(static_cast<float>(rstd[g]));
    for (Index j = 0; j < spg; j += kF) {
      const Index c = g * spg + j;
      // A group's last partial vector whole where that stays within the spg·groups entries (the lanes past
      // the group hold this group's values for the next groups' channels until their stores overwrite
      // them), as spread_values does.
      const int k = c + kF <= spg * groups ? kF : static_cast<int>(std::min<Index>(kF, spg - j));
      VF sv = r1;
      if (w) {
        const VF wv = load_k(w, c, k);
        sv = narrow_pd(mul(r, cvt_lo(wv)), mul(r, cvt_hi(wv)));
      }
      if (k == kF) {
        store(mh + c, vh);
        store(ml + c, vl);
        store(s + c, sv);
      } else {
        store_n(mh + c, vh, k);
        store_n(ml + c, vl, k);
        store_n(s + c, sv, k);
      }
    }
  }
}

// The constants of an input_grad pass (input_grad_consts of channel_norm.cpp, without γ) per channel from
// its group's statistics: for channel c = g·spg + j, mh[c] = float(mean[g]), ml[c] = float(mean[g] −
// mh[c]), r[c] = float(rstd[g]), c0[c] = float(mg[g]), c2[c] = float(rstd[g]·mgx[g]). One channel per
// group (InstanceNorm): sixteen groups per vector; up to kScalarConstsUpTo channels one by one; more group
// by group, each group's values broadcast over its channels.
void single_input_grad_consts(const InputGradOut& o, const double* mean, const double* rstd, const double* mg,
                              const double* mgx, Index spg, Index groups) {
  Index g = 0;
  if (spg == 1) {
    // Scalar math: as below, for sixteen groups at once (the last groups % 16 in the loop below)
    for (; g + kF <= groups; g += kF) {
      store_mean_pairs(o.mh + g, o.ml + g, mean + g);
      const VD r0 = loadd(rstd + g), r1 = loadd(rstd + g + kD);
      store(o.r + g, narrow_pd(r0, r1));
      store(o.c0 + g, narrow_pd(loadd(mg + g), loadd(mg + g + kD)));
      store(o.c2 + g, narrow_pd(mul(r0, loadd(mgx + g)), mul(r1, loadd(mgx + g + kD))));
    }
  }
  if (spg <= kScalarConstsUpTo) {
    for (; g < groups; ++g) {
      const float h = static_cast<float>(mean[g]);
      const float v[5] = {h, static_cast<float>(mean[g] - static_cast<double>(h)),
                          static_cast<float>(rstd[g]), static_cast<float>(mg[g]),
                          static_cast<float>(rstd[g] * mgx[g])};
      for (Index c = g * spg; c < (g + 1) * spg; ++c)
        o.mh[c] = v[0], o.ml[c] = v[1], o.r[c] = v[2], o.c0[c] = v[3], o.c2[c] = v[4];
    }
  }
  for (; g < groups; ++g) {
    // Scalar math: the group's five values, stored at each of its spg channels
    const float h = static_cast<float>(mean[g]);
    const VF v[5] = {bcast(h), bcast(static_cast<float>(mean[g] - static_cast<double>(h))),
                     bcast(static_cast<float>(rstd[g])), bcast(static_cast<float>(mg[g])),
                     bcast(static_cast<float>(rstd[g] * mgx[g]))};
    float* const out[5] = {o.mh, o.ml, o.r, o.c0, o.c2};
    for (Index j = 0; j < spg; j += kF) {
      const Index c = g * spg + j;
      // The group's last partial vector whole where that stays within the entries (spread_values).
      const int k = c + kF <= spg * groups ? kF : static_cast<int>(std::min<Index>(kF, spg - j));
      for (int a = 0; a < 5; ++a) {
        if (k == kF)
          store(out[a] + c, v[a]);
        else
          store_n(out[a] + c, v[a], k);
      }
    }
  }
}

// acc[g] = (Σ_j t[g·spg + j]) / count from 0.0 in j order (count 0: 0), eight groups at a time as
// single_moments, the rest one by one.
void group_means(double* acc, const double* t, Index spg, Index groups, double count) {
  const VD vcount = bcastd(count);
  Index g = 0;
  // Scalar math: acc[g] = (0 + t[g·spg] + t[g·spg + 1] + ...) / count
  for (; g + kD <= groups; g += kD) {
    VD a = zerod();
    for (Index j = 0; j < spg; ++j) a = add(a, column_load(t + g * spg + j, spg));
    stored(acc + g, count > 0 ? div(a, vcount) : zerod());
  }
  for (; g < groups; ++g) {
    double a = 0.0;
    for (Index j = 0; j < spg; ++j) a += t[g * spg + j];
    acc[g] = count > 0 ? a / count : 0.0;
  }
}

void single_grad_terms(const SingleGradTerms& o, const float* x, const float* dy, const float* w,
                       const double* gmean, const double* grstd, Index n) {
  const VD one = bcastd(1.0);
  // Scalar math: as single_moments' mean_s, e, m_lo; sdy = 0 + dy; sdyd = double(dy·e + 0) − m_lo·sdy;
  //   sdyxh = grstd[c]·(sdyd + (mean_s − gmean[c])·sdy); wsdy = w·sdy; wsdyxh = w·sdyxh
  each_half(x, n, [&](Index i, int h, VD xd, VF xf) {
    const Index j = i + h * kD;
    const int k = static_cast<int>(std::min<Index>(kF, n - i));
    const VF dyv = load_k(dy, i, k);
    const VD dyd = h ? cvt_hi(dyv) : cvt_lo(dyv);
    const VF dyf = h ? narrow_pd(dyd, zerod()) : dyv;
    const SingleLanes s = single_lanes(xd, xf);
    const VD sdy = add(zerod(), dyd);
    const VD sdyd = sub(cvt_lo(add(mul(dyf, s.e), zerof())), mul(s.ml, sdy));
    const VD v = mul(loadd(grstd + j), add(sdyd, mul(sub(s.mean, loadd(gmean + j)), sdy)));
    VD wd = one;
    if (w) {
      const VF wv = load_k(w, i, k);
      wd = h ? cvt_hi(wv) : cvt_lo(wv);
    }
    stored(o.sdy + j, sdy);
    stored(o.sdyxh + j, v);
    stored(o.wsdy + j, mul(wd, sdy));
    stored(o.wsdyxh + j, mul(wd, v));
  });
}

// ---- Sample runs: the run's groups combined ------------------------------------------------------------
// (channel_kernels.h, run_moments / run_grads.) Lane l of a block of eight holds group g0 + l; its entries
// for segment j are spg apart in the columns (column_load). The groups past the last full block go one at a
// time through the same expressions in scalar double (this file is compiled without FMA contraction).

void run_moments(double* mean, double* var, double* rstd, const SegmentColumns& st, Index spg, Index groups,
                 double ns, double count, double eps) {
  const VD vns = bcastd(ns), vcount = bcastd(count), veps = bcastd(eps), one = bcastd(1.0);
  Index g = 0;
  // Scalar math: mean[g] = (0 + Σ_j sum[s]) / count; var[g] = (0 + Σ_j (m2[s] + (ns·d)·d)) / count,
  //   d = mean_s[s] − mean[g], s = g·spg + j; rstd[g] = 1 / √(var[g] + eps) (count 0: all 0)
  for (; g + kD <= groups; g += kD) {
    const Index s0 = g * spg;
    VD m = zerod();
    for (Index j = 0; j < spg; ++j) m = add(m, column_load(st.sum + s0 + j, spg));
    m = count > 0 ? div(m, vcount) : zerod();
    VD v = zerod();
    for (Index j = 0; j < spg; ++j) {
      const VD d = sub(column_load(st.mean + s0 + j, spg), m);
      v = add(v, add(column_load(st.m2 + s0 + j, spg), mul(mul(vns, d), d)));
    }
    v = count > 0 ? div(v, vcount) : zerod();
    stored(mean + g, m);
    stored(var + g, v);
    stored(rstd + g, count > 0 ? div(one, sqrtd(add(v, veps))) : zerod());
  }
  for (; g < groups; ++g) {
    const Index s0 = g * spg;
    double m = 0.0;
    for (Index j = 0; j < spg; ++j) m += st.sum[s0 + j];
    m = count > 0 ? m / count : 0.0;
    double v = 0.0;
    for (Index j = 0; j < spg; ++j) {
      const double d = st.mean[s0 + j] - m;
      v += st.m2[s0 + j] + ns * d * d;
    }
    v = count > 0 ? v / count : 0.0;
    mean[g] = m;
    var[g] = v;
    rstd[g] = count > 0 ? 1.0 / std::sqrt(v + eps) : 0.0;
  }
}

void run_grads(double* mg, double* mgx, double* sdyxh, const SegmentColumns& st, const double* mean,
               const double* rstd, const float* w, Index spg, Index groups, double count) {
  const VD one = bcastd(1.0), vcount = bcastd(count);
  Index g = 0;
  // Scalar math: v = rstd[g]·(sdyd[s] + (mean_s[s] − mean[g])·sdy[s]) into sdyxh[s];
  //   mg[g] = (0 + Σ_j w_s·sdy[s]) / count, mgx[g] = (0 + Σ_j w_s·v) / count (count 0: 0)
  for (; g + kD <= groups; g += kD) {
    const Index s0 = g * spg;
    const VD m = loadd(mean + g), r = loadd(rstd + g);
    VD a = zerod(), b = zerod();
    for (Index j = 0; j < spg; ++j) {
      const Index s = s0 + j;
      const VD sdy = column_load(st.sdy + s, spg);
      const VD v =
          mul(r, add(column_load(st.sdyd + s, spg), mul(sub(column_load(st.mean + s, spg), m), sdy)));
      const VD wc = w ? column_cvt(w + s, spg) : one;
      a = add(a, mul(wc, sdy));
      b = add(b, mul(wc, v));
      column_store(sdyxh + s, spg, v);
    }
    stored(mg + g, count > 0 ? div(a, vcount) : zerod());
    stored(mgx + g, count > 0 ? div(b, vcount) : zerod());
  }
  for (; g < groups; ++g) {
    double a = 0.0, b = 0.0;
    for (Index j = 0; j < spg; ++j) {
      const Index s = g * spg + j;
      const double sdy = st.sdy[s];
      const double v = rstd[g] * (st.sdyd[s] + (st.mean[s] - mean[g]) * sdy);
      const double wc = w ? static_cast<double>(w[s]) : 1.0;
      a += wc * sdy;
      b += wc * v;
      sdyxh[s] = v;
    }
    mg[g] = count > 0 ? a / count : 0.0;
    mgx[g] = count > 0 ? b / count : 0.0;
  }
}

}  // namespace
}  // namespace chan

extern const ChannelKernels kChannelTable;
const ChannelKernels kChannelTable = {vec::leave_clean<chan::segment_stats>,
                                      vec::leave_clean<chan::segments_stats>,
                                      vec::leave_clean<chan::segment_grad_stats>,
                                      vec::leave_clean<chan::segments_grad_stats>,
                                      vec::leave_clean<chan::normalize>,
                                      vec::leave_clean<chan::input_grad>,
                                      vec::leave_clean<chan::segments_normalize>,
                                      vec::leave_clean<chan::segments_input_grad>,
                                      vec::leave_clean<chan::fence>,
                                      vec::leave_clean<chan::rows_sum>,
                                      vec::leave_clean<chan::rows_sqdev>,
                                      vec::leave_clean<chan::rows_grads>,
                                      vec::leave_clean<chan::rows_normalize>,
                                      vec::leave_clean<chan::rows_input_grad>,
                                      vec::leave_clean<chan::single_moments>,
                                      vec::leave_clean<chan::group_means>,
                                      vec::leave_clean<chan::single_normalize_consts>,
                                      vec::leave_clean<chan::single_input_grad_consts>,
                                      vec::leave_clean<chan::spread_groups>,
                                      vec::leave_clean<chan::spread_groupsd>,
                                      vec::leave_clean<chan::single_grad_terms>,
                                      vec::leave_clean<chan::run_moments>,
                                      vec::leave_clean<chan::run_grads>};

}  // namespace normlab::kernels::NL_TARGET
