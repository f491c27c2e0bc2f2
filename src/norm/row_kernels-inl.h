// Row kernels, compiled once per target: include with NL_TARGET defined to the target's name.
// See row_kernels.h for the contract. No include guard on purpose.
#ifndef NL_TARGET
#error "define NL_TARGET before including row_kernels-inl.h"
#endif

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "norm/row_kernels.h"
#include "simd/vec.h"

namespace normlab::kernels::NL_TARGET {
namespace {

// Combines the lanes pairwise in a fixed order: (0+8)+(4+12)... for 16 lanes.
inline double lane_tree(double* acc) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

double sum(const float* x, Index n) {
  double acc[kLanes] = {};
  Index i = 0;
  // Scalar math: acc[i % kLanes] += x[i]
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(x[i + l]);
  for (int l = 0; i + l < n; ++l) acc[l] += static_cast<double>(x[i + l]);
  return lane_tree(acc);
}

double sum_sq_dev(const float* x, Index n, double mean) {
  double acc[kLanes] = {};
  Index i = 0;
  // Scalar math: d = x[i] − mean; acc[i % kLanes] += d·d
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double d = static_cast<double>(x[i + l]) - mean;
      acc[l] += d * d;
    }
  for (int l = 0; i + l < n; ++l) {
    const double d = static_cast<double>(x[i + l]) - mean;
    acc[l] += d * d;
  }
  return lane_tree(acc);
}

void forward(float* y, const float* x, Index n, double mean, double rstd, const float* w, const float* b) {
  // Scalar math: y[i] = float((x[i] − mean)·rstd·w[i] + b[i])
  if (w && b) {
    for (Index i = 0; i < n; ++i)
      y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd * static_cast<double>(w[i]) +
                                static_cast<double>(b[i]));
  } else if (w) {
    for (Index i = 0; i < n; ++i)
      y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd * static_cast<double>(w[i]));
  } else if (b) {
    for (Index i = 0; i < n; ++i)
      y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd + static_cast<double>(b[i]));
  } else {
    for (Index i = 0; i < n; ++i) y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd);
  }
}

void backward_sums(double* sums, double* dw, double* db, const float* dy, const float* x, Index n,
                   double mean, double rstd, const float* w) {
  double sg[kLanes] = {}, sgx[kLanes] = {};
  // Scalar math: x̂ = (x[i] − mean)·rstd; g = dy[i]·w[i]; Σg += g; Σgx̂ += g·x̂;
  //              dw[i] += dy[i]·x̂; db[i] += dy[i]
  auto step = [&](Index i, int l) {
    const double xh = (static_cast<double>(x[i]) - mean) * rstd;
    const double d = static_cast<double>(dy[i]);
    const double g = w ? d * static_cast<double>(w[i]) : d;
    sg[l] += g;
    sgx[l] += g * xh;
  };
  Index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) step(i + l, l);
  for (int l = 0; i + l < n; ++l) step(i + l, l);
  sums[0] = lane_tree(sg);
  sums[1] = lane_tree(sgx);
  if (dw)
    for (Index j = 0; j < n; ++j)
      dw[j] += static_cast<double>(dy[j]) * ((static_cast<double>(x[j]) - mean) * rstd);
  if (db)
    for (Index j = 0; j < n; ++j) db[j] += static_cast<double>(dy[j]);
}

void backward_dx(float* dx, const float* dy, const float* x, Index n, double mean, double rstd,
                 const float* w, double mean_g, double mean_gx) {
  // Scalar math: dx[i] = float(rstd·(dy[i]·w[i] − mean_g − x̂·mean_gx)), x̂ = (x[i] − mean)·rstd
  for (Index i = 0; i < n; ++i) {
    const double xh = (static_cast<double>(x[i]) - mean) * rstd;
    const double g = w ? static_cast<double>(dy[i]) * static_cast<double>(w[i]) : static_cast<double>(dy[i]);
    dx[i] = static_cast<float>(rstd * (g - mean_g - xh * mean_gx));
  }
}

void forward_scalar(float* y, const float* x, Index n, double mean, double rstd, double w, double b) {
  // Scalar math: y[i] = float((x[i] − mean)·rstd·w + b)
  for (Index i = 0; i < n; ++i) y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd * w + b);
}

void backward_dx_scalar(float* dx, const float* dy, const float* x, Index n, double mean, double rstd,
                        double w, double mean_g, double mean_gx) {
  // Scalar math: dx[i] = float(rstd·(dy[i]·w − mean_g − x̂·mean_gx)), x̂ = (x[i] − mean)·rstd
  for (Index i = 0; i < n; ++i) {
    const double xh = (static_cast<double>(x[i]) - mean) * rstd;
    dx[i] = static_cast<float>(rstd * (static_cast<double>(dy[i]) * w - mean_g - xh * mean_gx));
  }
}

// ---- Fused row kernels (LayerNorm / RMSNorm over contiguous rows) -------------------------------------
//
// Written against simd/vec.h (16-float and 8-double vectors with the same lane semantics on every
// target), so every target gives the same bits. The numerics are those of docs/numerics.md
// ("Precision"): mean in double from the exactly converted floats; d = (x − m_hi) − m_lo in float with
// m_hi = float(mean), m_lo = float(mean − m_hi); Σd² from float squares added in pairs, accumulated in
// double; every elementwise output in float.
// The fused kernels are templates on the storage type T of the full-shaped operands (x, y; dy, dx):
// float, or bfloat16 / float16 through the 16-bit loads and stores of simd/vec.h (exact widening, one
// rounding at the store), so the arithmetic is the same code for every storage type.

using namespace vec;  // NOLINT: the vector layer of this target

struct RowStats {
  double mean = 0, rstd = 0;
  float mh = 0, ml = 0, r = 0;  // float(mean), float(mean − mh), float(rstd)
};

template <bool Center>
inline VF dev(VF x, VF mh, VF ml) {
  if constexpr (Center) return sub(sub(x, mh), ml);
  return x;
}

// Σ x[i] in double. Blocks of 32: acc0 += x[i..i+8), acc1 += x[i+8..i+16), acc2, acc3 likewise; a tail
// shorter than 32 is zero-padded; result hsum((acc0 + acc1) + (acc2 + acc3)).
template <typename T>
inline double row_sum(const T* x, Index n) {
  VD a0 = zerod(), a1 = zerod(), a2 = zerod(), a3 = zerod();
  Index i = 0;
  // Scalar math: acc[(i / 8) % 4][i % 8] += double(x[i])
  for (; i + 32 <= n; i += 32) {
    a0 = add(a0, load_cvt(x + i));
    a1 = add(a1, load_cvt(x + i + 8));
    a2 = add(a2, load_cvt(x + i + 16));
    a3 = add(a3, load_cvt(x + i + 24));
  }
  if (i < n) {
    const int k = static_cast<int>(n - i);
    const VF u = load_n(x + i, std::min(k, kF));
    const VF v = k > kF ? load_n(x + i + kF, k - kF) : zerof();
    a0 = add(a0, cvt_lo(u));
    a1 = add(a1, cvt_hi(u));
    a2 = add(a2, cvt_lo(v));
    a3 = add(a3, cvt_hi(v));
  }
  return hsum(add(add(a0, a1), add(a2, a3)));
}

// The second pass, around m_hi = float(mean) (Center) or 0 (RMSNorm): e = x − m_hi in float. Blocks of 64
// elements (four VF a, b, c, d; a tail is zero-padded and its e masked to 0):
//   q = (ea·ea + eb·eb) + (ec·ec + ed·ed)                          (float)
// and with dy, g = dy·w:
//   sg = (ga + gb) + (gc + gd),  sge = (ga·ea + gb·eb) + (gc·ec + gd·ed)   (float)
// Each float block sum is added to two double accumulators (its lanes 0..7 and 8..15); a total is
// hsum(acc_lo + acc_hi). The caller corrects for m_lo = mean − m_hi exactly in double:
//   Σ(x − mean)² = Σe² − n·m_lo²,  Σg·(x − mean) = Σg·e − m_lo·Σg.
struct SecondPass {
  double sq = 0, sg = 0, sge = 0;
};

template <bool Center, bool WithDy, bool W, typename T>
inline SecondPass row_second_pass(const T* x, std::type_identity_t<const T*> dy, const float* w, Index n, VF mh) {
  VD q0 = zerod(), q1 = zerod(), g0 = zerod(), g1 = zerod(), p0 = zerod(), p1 = zerod();
  const VF z = zerof();
  auto dev0 = [&](VF v) { return Center ? sub(v, mh) : v; };
  // k[] = valid lanes of each of the four vectors (16 except in the tail).
  auto block = [&](Index i, const int* k, bool tail) {
    VF e[4], g[4];
    for (int u = 0; u < 4; ++u) {
      const VF xv = !tail ? load(x + i + u * kF) : k[u] ? load_n(x + i + u * kF, k[u]) : z;
      e[u] = dev0(xv);
      if (tail) e[u] = keep_n(e[u], k[u]);
      if constexpr (WithDy) {
        const VF dyv = !tail ? load(dy + i + u * kF) : k[u] ? load_n(dy + i + u * kF, k[u]) : z;
        if constexpr (W) {
          const VF wv = !tail ? load(w + i + u * kF) : k[u] ? load_n(w + i + u * kF, k[u]) : z;
          g[u] = mul(dyv, wv);
        } else {
          g[u] = dyv;
        }
      }
    }
    const VF q = add(add(mul(e[0], e[0]), mul(e[1], e[1])), add(mul(e[2], e[2]), mul(e[3], e[3])));
    q0 = add(q0, cvt_lo(q));
    q1 = add(q1, cvt_hi(q));
    if constexpr (WithDy) {
      const VF sg = add(add(g[0], g[1]), add(g[2], g[3]));
      const VF sge = add(add(mul(g[0], e[0]), mul(g[1], e[1])), add(mul(g[2], e[2]), mul(g[3], e[3])));
      g0 = add(g0, cvt_lo(sg));
      g1 = add(g1, cvt_hi(sg));
      p0 = add(p0, cvt_lo(sge));
      p1 = add(p1, cvt_hi(sge));
    }
  };
  static constexpr int kFull[4] = {kF, kF, kF, kF};
  Index i = 0;
  // Scalar math: e = x[i] − m_hi; Σe² (and Σg, Σg·e with g = dy[i]·w[i]) as described above
  for (; i + 4 * kF <= n; i += 4 * kF) block(i, kFull, false);
  if (i < n) {
    int k[4];
    for (int u = 0; u < 4; ++u) k[u] = static_cast<int>(std::clamp<Index>(n - i - u * kF, 0, kF));
    block(i, k, true);
  }
  SecondPass s;
  s.sq = hsum(add(q0, q1));
  if constexpr (WithDy) {
    s.sg = hsum(add(g0, g1));
    s.sge = hsum(add(p0, p1));
  }
  return s;
}

template <bool Center, typename T>
inline double row_mean(const T* x, Index n, RowStats& st) {
  st.mean = Center ? row_sum(x, n) / static_cast<double>(n) : 0.0;
  st.mh = static_cast<float>(st.mean);
  st.ml = static_cast<float>(st.mean - static_cast<double>(st.mh));
  return st.mean;
}

// var = (Σe² − n·m_lo²)/n = Σe²/n − m_lo², floored at 0 (it can only go below by rounding).
inline void finish_rstd(RowStats& st, double sq, Index n, double eps) {
  const double ml = static_cast<double>(st.ml);
  const double var = std::max(sq / static_cast<double>(n) - ml * ml, 0.0);
  st.rstd = 1.0 / std::sqrt(var + eps);
  st.r = static_cast<float>(st.rstd);
}

// Rows are handled in blocks of up to kMaxBlock (about 16 KiB of x): each stage (Σx, second pass,
// rstd, output) runs over all rows of the block before the next, so that the short dependency chains
// of different rows overlap. The block changes only the order of independent work, never a result.
inline constexpr int kMaxBlock = 8;
inline int block_rows(Index n) { return static_cast<int>(std::clamp<Index>(4096 / n, 1, kMaxBlock)); }

template <bool Center, bool W, bool B, typename T>
void rows_forward_impl(const RowsForwardOf<T>& a) {
  const Index n = a.n;
  const int block = block_rows(n);
  const VF z = zerof();
  for (Index r0 = 0; r0 < a.rows; r0 += block) {
    const int nr = static_cast<int>(std::min<Index>(block, a.rows - r0));
    RowStats st[kMaxBlock];
    const T* xs[kMaxBlock];
    for (int j = 0; j < nr; ++j) xs[j] = a.x + (r0 + j) * a.ldx;
    for (int j = 0; j < nr; ++j) row_mean<Center>(xs[j], n, st[j]);
    double sq[kMaxBlock];
    for (int j = 0; j < nr; ++j)
      sq[j] = row_second_pass<Center, false, false>(xs[j], nullptr, nullptr, n, bcast(st[j].mh)).sq;
    for (int j = 0; j < nr; ++j) {
      finish_rstd(st[j], sq[j], n, a.eps);
      if (a.mean) a.mean[(r0 + j) * a.ld_stats] = st[j].mh;
      if (a.rstd) a.rstd[(r0 + j) * a.ld_stats] = st[j].r;
    }
    for (int j = 0; j < nr; ++j) {
      const T* x = xs[j];
      T* y = a.y + (r0 + j) * a.ldy;
      const VF mh = bcast(st[j].mh), ml = bcast(st[j].ml), r = bcast(st[j].r);
      auto out = [&](VF xv, VF wv, VF bv) {
        VF v = mul(dev<Center>(xv, mh, ml), r);
        if constexpr (W) v = mul(v, wv);
        if constexpr (B) v = add(v, bv);
        return v;
      };
      Index i = 0;
      // Scalar math: y[i] = ((x[i] − mh) − ml)·r·w[i] + b[i], all in float
      if (a.stream && stream_ok(y)) {
        for (; i + kF <= n; i += kF)
          stream(y + i, out(load(x + i), W ? load(a.w + i) : z, B ? load(a.b + i) : z));
      } else {
        for (; i + kF <= n; i += kF)
          store(y + i, out(load(x + i), W ? load(a.w + i) : z, B ? load(a.b + i) : z));
      }
      if (i < n) {
        const int k = static_cast<int>(n - i);
        store_n(y + i, out(load_n(x + i, k), W ? load_n(a.w + i, k) : z, B ? load_n(a.b + i, k) : z), k);
      }
    }
  }
  if (a.stream) stream_fence();
}

// The same arithmetic as rows_forward_impl for n a multiple of 64, software-pipelined over rows: step s
// runs Σx of row s, the second pass of row s − 1 and the output of row s − 2 in one loop over the
// columns. The output pass is bound by memory traffic and the two statistics passes by arithmetic;
// interleaving them lets the two overlap. Every pass keeps its own accumulators and order, so the
// results are those of rows_forward_impl bit for bit.
template <bool Center, typename T>
inline void mean_block64(VD& a0, VD& a1, VD& a2, VD& a3, const T* x) {
  a0 = add(a0, load_cvt(x));
  a1 = add(a1, load_cvt(x + 8));
  a2 = add(a2, load_cvt(x + 16));
  a3 = add(a3, load_cvt(x + 24));
  a0 = add(a0, load_cvt(x + 32));
  a1 = add(a1, load_cvt(x + 40));
  a2 = add(a2, load_cvt(x + 48));
  a3 = add(a3, load_cvt(x + 56));
}

template <bool Center, typename T>
inline void second_block64(VD& q0, VD& q1, const T* x, VF mh) {
  VF e[4];
  for (int u = 0; u < 4; ++u) e[u] = Center ? sub(load(x + u * kF), mh) : load(x + u * kF);
  const VF q = add(add(mul(e[0], e[0]), mul(e[1], e[1])), add(mul(e[2], e[2]), mul(e[3], e[3])));
  q0 = add(q0, cvt_lo(q));
  q1 = add(q1, cvt_hi(q));
}

template <bool Center, bool W, bool B, typename T>
void rows_forward_pipelined(const RowsForwardOf<T>& a) {
  const Index n = a.n, rows = a.rows;
  RowStats st[3];  // by row index mod 3
  for (Index s = 0; s < rows + 2; ++s) {
    const bool do_mean = Center && s < rows;
    const bool do_second = s >= 1 && s - 1 < rows;
    const bool do_out = s >= 2;
    const T* xa = a.x + s * a.ldx;
    const T* xb = a.x + (s - 1) * a.ldx;
    const T* xc = a.x + (s - 2) * a.ldx;
    T* yc = a.y + (s - 2) * a.ldy;
    RowStats& sb = st[(s + 2) % 3];  // row s − 1
    RowStats& sc = st[(s + 1) % 3];  // row s − 2
    const VF mhb = bcast(sb.mh);
    const VF mhc = bcast(sc.mh), mlc = bcast(sc.ml), rc = bcast(sc.r);
    const bool st_c = do_out && a.stream && stream_ok(yc);
    VD a0 = zerod(), a1 = zerod(), a2 = zerod(), a3 = zerod(), q0 = zerod(), q1 = zerod();
    // Scalar math: as rows_forward_impl (Σx in blocks of 32; Σe² in blocks of 64; y per element)
    for (Index i = 0; i < n; i += 64) {
      if (do_mean) mean_block64<Center>(a0, a1, a2, a3, xa + i);
      if (do_second) second_block64<Center>(q0, q1, xb + i, mhb);
      if (do_out) {
        for (int u = 0; u < 4; ++u) {
          const Index k = i + u * kF;
          VF v = mul(dev<Center>(load(xc + k), mhc, mlc), rc);
          if constexpr (W) v = mul(v, load(a.w + k));
          if constexpr (B) v = add(v, load(a.b + k));
          if (st_c)
            stream(yc + k, v);
          else
            store(yc + k, v);
        }
      }
    }
    if (do_second) {
      finish_rstd(sb, hsum(add(q0, q1)), n, a.eps);
      if (a.mean) a.mean[(s - 1) * a.ld_stats] = sb.mh;
      if (a.rstd) a.rstd[(s - 1) * a.ld_stats] = sb.r;
    }
    if (s < rows) {
      RowStats& sa = st[s % 3];
      sa = RowStats{};
      if (Center) {
        sa.mean = hsum(add(add(a0, a1), add(a2, a3))) / static_cast<double>(n);
        sa.mh = static_cast<float>(sa.mean);
        sa.ml = static_cast<float>(sa.mean - static_cast<double>(sa.mh));
      }
    }
  }
  if (a.stream) stream_fence();
}

template <typename T>
void rows_forward_of(const RowsForwardOf<T>& a) {
  const bool w = a.w != nullptr, b = a.b != nullptr;
  if (a.n % 64 == 0 && a.n >= 256) {
    if (a.center) {
      if (w && b) return rows_forward_pipelined<true, true, true>(a);
      if (w) return rows_forward_pipelined<true, true, false>(a);
      if (b) return rows_forward_pipelined<true, false, true>(a);
      return rows_forward_pipelined<true, false, false>(a);
    }
    if (w && b) return rows_forward_pipelined<false, true, true>(a);
    if (w) return rows_forward_pipelined<false, true, false>(a);
    if (b) return rows_forward_pipelined<false, false, true>(a);
    return rows_forward_pipelined<false, false, false>(a);
  }
  if (a.center) {
    if (w && b) return rows_forward_impl<true, true, true>(a);
    if (w) return rows_forward_impl<true, true, false>(a);
    if (b) return rows_forward_impl<true, false, true>(a);
    return rows_forward_impl<true, false, false>(a);
  }
  if (w && b) return rows_forward_impl<false, true, true>(a);
  if (w) return rows_forward_impl<false, true, false>(a);
  if (b) return rows_forward_impl<false, false, true>(a);
  return rows_forward_impl<false, false, false>(a);
}

template <bool Center, bool W, typename T>
void rows_backward_impl(const RowsBackwardOf<T>& a) {
  const Index n = a.n;
  constexpr int R = kParamGradRowGroup;
  const double nd = static_cast<double>(n);
  for (Index r0 = 0; r0 < a.rows; r0 += R) {
    const int nr = static_cast<int>(std::min<Index>(R, a.rows - r0));
    const T* xs[R];
    const T* dys[R];
    T* dxs[R];
    bool st_ok[R];
    VF mh[R], ml[R], r[R], c0[R], c2[R];
    RowStats st[R];
    for (int j = 0; j < nr; ++j) {
      xs[j] = a.x + (r0 + j) * a.ldx;
      dys[j] = a.dy + (r0 + j) * a.lddy;
      dxs[j] = a.dx + (r0 + j) * a.lddx;
      st_ok[j] = a.stream && stream_ok(dxs[j]);
    }
    for (int j = 0; j < nr; ++j) {
      row_mean<Center>(xs[j], n, st[j]);
      mh[j] = bcast(st[j].mh);
      ml[j] = bcast(st[j].ml);
    }
    SecondPass sp[R];
    for (int j = 0; j < nr; ++j) sp[j] = row_second_pass<Center, true, W>(xs[j], dys[j], a.w, n, mh[j]);
    for (int j = 0; j < nr; ++j) {
      finish_rstd(st[j], sp[j].sq, n, a.eps);
      // dx = rstd·(g − mean_g − x̂·mean_gx̂) = r·((g − mean_g) − d·(rstd·mean_gx̂)),
      // mean_gx̂ = rstd·Σg·d / n with Σg·d = Σg·e − m_lo·Σg.
      const double mean_g = Center ? sp[j].sg / nd : 0.0;
      const double sgd = sp[j].sge - static_cast<double>(st[j].ml) * sp[j].sg;
      const double mean_gxh = st[j].rstd * sgd / nd;
      r[j] = bcast(st[j].r);
      c0[j] = bcast(static_cast<float>(mean_g));
      c2[j] = bcast(static_cast<float>(st[j].rstd * mean_gxh));
    }
    const bool first = a.init && r0 == 0;
    const VF z = zerof();
    // Scalar math (per column i, rows j of the group in order):
    //   d = (x[j][i] − mh) − ml; g = dy[j][i]·w[i]; dx[j][i] = r·((g − c0) − d·c2), c0 = float(mean_g),
    //   c2 = float(rstd·mean_gx̂);
    //   pw += double(dy[j][i]·(d·r)); pb += double(dy[j][i])   (double, from 0)
    //   dw[i] = (first ? 0 : dw[i]) + double(pw); db likewise
    auto column = [&](Index i, int k, bool tail) {
      const VF wv = W ? (tail ? load_n(a.w + i, k) : load(a.w + i)) : z;
      VD pw0 = zerod(), pw1 = zerod(), pb0 = zerod(), pb1 = zerod();
      for (int j = 0; j < nr; ++j) {
        const VF xv = tail ? load_n(xs[j] + i, k) : load(xs[j] + i);
        const VF dyv = tail ? load_n(dys[j] + i, k) : load(dys[j] + i);
        const VF d = dev<Center>(xv, mh[j], ml[j]);
        const VF g = W ? mul(dyv, wv) : dyv;
        VF gc = g;
        if constexpr (Center) gc = sub(gc, c0[j]);
        const VF dx = mul(r[j], sub(gc, mul(d, c2[j])));
        if (tail)
          store_n(dxs[j] + i, dx, k);
        else if (st_ok[j])
          stream(dxs[j] + i, dx);
        else
          store(dxs[j] + i, dx);
        if (a.dw) {
          const VF p = mul(dyv, mul(d, r[j]));
          pw0 = add(pw0, cvt_lo(p));
          pw1 = add(pw1, cvt_hi(p));
        }
        if (a.db) {
          pb0 = add(pb0, cvt_lo(dyv));
          pb1 = add(pb1, cvt_hi(dyv));
        }
      }
      auto flush = [&](double* part, VD p0, VD p1) {
        if (!tail) {
          if (first) {
            stored(part + i, p0);
            stored(part + i + kD, p1);
          } else {
            stored(part + i, add(loadd(part + i), p0));
            stored(part + i + kD, add(loadd(part + i + kD), p1));
          }
          return;
        }
        double t[kF];
        stored(t, p0);
        stored(t + kD, p1);
        for (int l = 0; l < k; ++l) part[i + l] = first ? t[l] : part[i + l] + t[l];
      };
      if (a.dw) flush(a.dw, pw0, pw1);
      if (a.db) flush(a.db, pb0, pb1);
    };
    Index i = 0;
    for (; i + kF <= n; i += kF) column(i, kF, false);
    if (i < n) column(i, static_cast<int>(n - i), true);
  }
  if (a.stream) stream_fence();
}

template <typename T>
void rows_backward_of(const RowsBackwardOf<T>& a) {
  const bool w = a.w != nullptr;
  if (a.center) return w ? rows_backward_impl<true, true>(a) : rows_backward_impl<true, false>(a);
  return w ? rows_backward_impl<false, true>(a) : rows_backward_impl<false, false>(a);
}

void rows_forward(const RowsForward& a) { rows_forward_of(a); }
void rows_backward(const RowsBackward& a) { rows_backward_of(a); }

}  // namespace

extern const RowKernels kTable;
const RowKernels kTable = {sum,         sum_sq_dev,     forward,           backward_sums,
                           backward_dx, forward_scalar, backward_dx_scalar, rows_forward,
                           rows_backward};

}  // namespace normlab::kernels::NL_TARGET
