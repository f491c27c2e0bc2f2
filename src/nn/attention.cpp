// Multi-head self-attention: q, k, v, o projections around scaled dot-product attention, causal or
// bidirectional, with an optional padding mask. See include/normlab/nn/layers.h for the contract.
#include <normlab/nn/layers.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "nn/checks.h"
#include "nn/gemm.h"
#include "nn/scratch.h"
#include "parallel/parallel.h"

namespace normlab::nn {

namespace {

void check_attention(Index B, Index T, Index C, Index H, std::span<const Index> lengths) {
  detail::check_size("attention", "B", B);
  detail::check_size("attention", "T", T);
  detail::check_size("attention", "C", C);
  detail::check_size("attention", "H", H);
  NL_CHECK(C % H == 0, "attention: heads (H) must divide d_model (C): H = {}, C = {}", H, C);
  detail::check_lengths("attention", lengths, B, T);
}

// Keys j < key_end(i) are allowed for query i of a sequence of real length len (i < len).
Index key_end(Index i, Index len, bool causal) { return causal ? std::min(i + 1, len) : len; }

}  // namespace

namespace {

// ---- The plain loops: the double path (the float64 reference the tests compare against) ------------

template <typename Real>
void sdpa_forward_loops(Real* ctx, Real* att, const Real* q, const Real* k, const Real* v,
                        std::span<const Index> lengths, Index B, Index T, Index C, Index H, bool causal) {
  const Index hs = C / H;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(hs));
  // One chunk per (b, h): its att block and its ctx channels [h·hs, (h+1)·hs) belong to it alone.
  parallel::parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H, len = detail::length_of(lengths, b, T);
    for (Index i = 0; i < T; ++i) {
      Real* arow = att + (bh * T + i) * T;
      Real* crow = ctx + (b * T + i) * C + h * hs;
      std::fill(arow, arow + T, Real(0));
      std::fill(crow, crow + hs, Real(0));
      if (i >= len) continue;  // padded query: att row and ctx row stay 0
      const Index jend = key_end(i, len, causal);
      const Real* qi = q + (b * T + i) * C + h * hs;
      // pre-softmax scores s_j = q_i·k_j / √hs, then the stable softmax over the allowed keys
      Real maxv = -std::numeric_limits<Real>::infinity();
      for (Index j = 0; j < jend; ++j) {
        const Real* kj = k + (b * T + j) * C + h * hs;
        Real s = 0;
        for (Index d = 0; d < hs; ++d) s += qi[d] * kj[d];
        arow[j] = s * scale;
        maxv = std::max(maxv, arow[j]);
      }
      Real sum = 0;
      for (Index j = 0; j < jend; ++j) {
        arow[j] = std::exp(arow[j] - maxv);
        sum += arow[j];
      }
      const Real inv = Real(1) / sum;
      for (Index j = 0; j < jend; ++j) arow[j] *= inv;
      // ctx_i = Σ_j att_ij · v_j
      for (Index j = 0; j < jend; ++j) {
        const Real* vj = v + (b * T + j) * C + h * hs;
        for (Index d = 0; d < hs; ++d) crow[d] += arow[j] * vj[d];
      }
    }
  });
}

template <typename Real>
void sdpa_backward_loops(Real* dq, Real* dk, Real* dv, const Real* dctx, const Real* q, const Real* k,
                         const Real* v, const Real* att, std::span<const Index> lengths, Index B, Index T,
                         Index C, Index H, bool causal) {
  const Index hs = C / H;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(hs));
  parallel::parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H, len = detail::length_of(lengths, b, T);
    std::vector<Real> datt(static_cast<std::size_t>(T));
    for (Index i = 0; i < len; ++i) {  // padded queries (i ≥ len) send nothing back
      const Index jend = key_end(i, len, causal);
      const Real* arow = att + (bh * T + i) * T;
      const Real* dci = dctx + (b * T + i) * C + h * hs;
      const Real* qi = q + (b * T + i) * C + h * hs;
      Real* dqi = dq + (b * T + i) * C + h * hs;
      // through ctx_i = Σ_j att_ij v_j:  datt_ij = dctx_i·v_j,  dv_j += att_ij · dctx_i
      Real dot = 0;  // Σ_j att_ij · datt_ij
      for (Index j = 0; j < jend; ++j) {
        const Real* vj = v + (b * T + j) * C + h * hs;
        Real* dvj = dv + (b * T + j) * C + h * hs;
        Real s = 0;
        for (Index d = 0; d < hs; ++d) {
          s += dci[d] * vj[d];
          dvj[d] += arow[j] * dci[d];
        }
        datt[static_cast<std::size_t>(j)] = s;
        dot += arow[j] * s;
      }
      // through the softmax: dpre_ij = att_ij·(datt_ij − Σ_k att_ik datt_ik);
      // through s_ij = q_i·k_j·scale: dq_i += scale·dpre_ij·k_j, dk_j += scale·dpre_ij·q_i
      for (Index j = 0; j < jend; ++j) {
        const Real dpre = arow[j] * (datt[static_cast<std::size_t>(j)] - dot) * scale;
        const Real* kj = k + (b * T + j) * C + h * hs;
        Real* dkj = dk + (b * T + j) * C + h * hs;
        for (Index d = 0; d < hs; ++d) {
          dqi[d] += dpre * kj[d];
          dkj[d] += dpre * qi[d];
        }
      }
    }
  });
}

// ---- The float path: per (batch, head) matrix products ------------------------------------------------
//
// For one (b, h) with real length len (padded queries and keys are the trailing t ≥ len), with
// Q, K, V, dctx the (len, hs) slices of q, k, v, dctx (row stride C) and P the (len, len) top-left of
// the att block (row stride T). Queries go in blocks [i0, i0 + m) of kQueryBlock rows; a block needs
// the keys j < kend = i0 + m when causal (the later ones are masked for all its rows), j < len if not:
//   forward   P[blk, :kend] = Q[blk]·K[:kend]ᵀ/√hs, softmax of each row over its allowed keys j < key_end(i)
//             (the rest of the row written 0), ctx[blk] = P[blk, :kend]·V[:kend]
//   backward  dP = dctx[blk]·V[:kend]ᵀ, dS = P ⊙ (dP − rowsum(P ⊙ dP))/√hs,
//             dV[:kend] += P[blk, :kend]ᵀ·dctx[blk], dQ[blk] += dS·K[:kend], dK[:kend] += dSᵀ·Q[blk]
// (blocks in increasing order). Every GEMM of a chunk runs on one thread (gemm's one_thread, also when
// a single chunk runs outside a parallel region): each (b, h) is computed alone and the bits do not
// depend on the thread count.
constexpr Index kQueryBlock = 32;

// Row i of P (len entries, the scores on [0, jend) on entry): the stable softmax over [0, jend), 0 on
// [jend, len).
void softmax_row(float* row, Index jend, Index len) {
  float maxv = -std::numeric_limits<float>::infinity();
  for (Index j = 0; j < jend; ++j) maxv = std::max(maxv, row[j]);
  float sum = 0;
  for (Index j = 0; j < jend; ++j) {
    row[j] = std::exp(row[j] - maxv);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  // Scalar math: row[j] = row[j]·inv
  for (Index j = 0; j < jend; ++j) row[j] *= inv;
  std::fill(row + jend, row + len, 0.0f);
}

void sdpa_forward_gemm(float* ctx, float* att, const float* q, const float* k, const float* v,
                       std::span<const Index> lengths, Index B, Index T, Index C, Index H, bool causal) {
  const Index hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  parallel::parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H, len = detail::length_of(lengths, b, T);
    float* P = att + bh * T * T;
    const Index off = b * T * C + h * hs;  // the (b, h) slice of a (B,T,C) tensor
    // padded query rows (i ≥ len) of att and ctx, and the padded key columns of the real rows: 0
    for (Index i = 0; i < T; ++i) std::fill(P + i * T + (i < len ? len : 0), P + (i + 1) * T, 0.0f);
    for (Index i = len; i < T; ++i) std::fill_n(ctx + off + i * C, hs, 0.0f);
    const Index qb = causal ? kQueryBlock : std::max<Index>(len, 1);
    for (Index i0 = 0; i0 < len; i0 += qb) {
      const Index m = std::min(qb, len - i0), kend = causal ? i0 + m : len;
      float* Pb = P + i0 * T;
      gemm<float>(false, true, m, kend, hs, scale, q + off + i0 * C, C, k + off, C, 0.0f, Pb, T, true);  // S = Q·Kᵀ/√hs
      for (Index i = i0; i < i0 + m; ++i) softmax_row(P + i * T, key_end(i, len, causal), len);
      gemm<float>(false, false, m, hs, kend, 1.0f, Pb, T, v + off, C, 0.0f, ctx + off + i0 * C, C, true);  // ctx = P·V
    }
  });
}

// overwrite: dq, dk, dv are written (=) rather than accumulated, padded rows included (0 there).
// The causal flag only saves work: the masked entries of att are 0 either way.
void sdpa_backward_gemm(float* dq, float* dk, float* dv, const float* dctx, const float* q, const float* k,
                        const float* v, const float* att, std::span<const Index> lengths, Index B, Index T,
                        Index C, Index H, bool causal, bool overwrite) {
  const Index hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  parallel::parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H, len = detail::length_of(lengths, b, T);
    const Index off = b * T * C + h * hs;
    if (overwrite)  // dK, dV accumulate over the query blocks: start from 0 (padded rows stay 0)
      for (Index i = 0; i < T; ++i)
        for (float* d : {dk, dv, dq}) std::fill_n(d + off + i * C, hs, 0.0f);
    if (len == 0) return;  // no real query: nothing flows back
    const float* P = att + bh * T * T;
    thread_local std::vector<float> dS;
    const Index qb = causal ? kQueryBlock : len;
    if (dS.size() < static_cast<std::size_t>(qb * len)) dS.resize(static_cast<std::size_t>(qb * len));
    for (Index i0 = 0; i0 < len; i0 += qb) {
      const Index m = std::min(qb, len - i0), kend = causal ? i0 + m : len;
      const float* Pb = P + i0 * T;
      const float* dcb = dctx + off + i0 * C;
      gemm<float>(false, true, m, kend, hs, 1.0f, dcb, C, v + off, C, 0.0f, dS.data(), kend, true);  // dP = dctx·Vᵀ
      gemm<float>(true, false, kend, hs, m, 1.0f, Pb, T, dcb, C, 1.0f, dv + off, C, true);          // dV += Pᵀ·dctx
      for (Index r = 0; r < m; ++r) {  // through the softmax: dS = P ⊙ (dP − Σ_j P_ij dP_ij)·scale
        const float* p = Pb + r * T;
        float* d = dS.data() + r * kend;
        float dot = 0;
        for (Index j = 0; j < kend; ++j) dot += p[j] * d[j];
        // Scalar math: d[j] = p[j]·(d[j] − dot)·scale
        for (Index j = 0; j < kend; ++j) d[j] = p[j] * (d[j] - dot) * scale;
      }
      gemm<float>(false, false, m, hs, kend, 1.0f, dS.data(), kend, k + off, C, 1.0f, dq + off + i0 * C, C, true);  // dQ += dS·K
      gemm<float>(true, false, kend, hs, m, 1.0f, dS.data(), kend, q + off + i0 * C, C, 1.0f, dk + off, C, true);   // dK += dSᵀ·Q
    }
  });
}

}  // namespace

template <typename Real>
void sdpa_forward(Real* ctx, Real* att, const Real* q, const Real* k, const Real* v,
                  std::span<const Index> lengths, Index B, Index T, Index C, Index H, bool causal) {
  // ctx is (B,T,C), att is (B,H,T,T); q, k, v are (B,T,C)
  check_attention(B, T, C, H, lengths);
  if constexpr (std::is_same_v<Real, float>) {
    sdpa_forward_gemm(ctx, att, q, k, v, lengths, B, T, C, H, causal);
  } else {
    sdpa_forward_loops(ctx, att, q, k, v, lengths, B, T, C, H, causal);
  }
}

template <typename Real>
void sdpa_backward(Real* dq, Real* dk, Real* dv, const Real* dctx, const Real* q, const Real* k,
                   const Real* v, const Real* att, std::span<const Index> lengths, Index B, Index T,
                   Index C, Index H, bool causal) {
  // dq, dk, dv are (B,T,C) (+=); dctx, q, k, v are (B,T,C); att is (B,H,T,T)
  check_attention(B, T, C, H, lengths);
  if constexpr (std::is_same_v<Real, float>) {
    sdpa_backward_gemm(dq, dk, dv, dctx, q, k, v, att, lengths, B, T, C, H, causal, false);
  } else {
    sdpa_backward_loops(dq, dk, dv, dctx, q, k, v, att, lengths, B, T, C, H, causal);
  }
}

template <typename Real>
void attention_forward(Real* out, const AttentionActs<Real>& acts, const Real* inp,
                       const AttentionParams<Real>& params, std::span<const Index> lengths, Index B, Index T,
                       Index C, Index H, bool causal) {
  // out, inp are (B,T,C); acts.q/k/v/ctx are (B,T,C), acts.att is (B,H,T,T)
  check_attention(B, T, C, H, lengths);
  const Index N = B * T;
  linear_forward(acts.q, inp, params.wq, params.bq, N, C, C);
  linear_forward(acts.k, inp, params.wk, params.bk, N, C, C);
  linear_forward(acts.v, inp, params.wv, params.bv, N, C, C);
  sdpa_forward(acts.ctx, acts.att, acts.q, acts.k, acts.v, lengths, B, T, C, H, causal);
  linear_forward(out, acts.ctx, params.wo, params.bo, N, C, C);
  // Padded query rows are 0 in the output too (no bias).
  for (Index b = 0; b < B; ++b)
    for (Index t = detail::length_of(lengths, b, T); t < T; ++t) std::fill_n(out + (b * T + t) * C, C, Real(0));
}

template <typename Real>
void attention_backward(Real* dinp, const AttentionGrads<Real>& grads, const Real* dout, const Real* inp,
                        const AttentionParams<Real>& params, const AttentionActs<Real>& acts,
                        std::span<const Index> lengths, Index B, Index T, Index C, Index H, bool causal) {
  // The literal reverse of attention_forward. dinp (nullable) is (B,T,C); dout is (B,T,C).
  check_attention(B, T, C, H, lengths);
  const Index N = B * T, n = N * C;
  // dout at padded rows is ignored: take a copy with those rows zeroed when there is padding.
  const Real* dy = dout;
  if (!lengths.empty()) {
    Real* d = detail::scratch<Real>(detail::kAttnDout, n);
    std::copy(dout, dout + n, d);
    for (Index b = 0; b < B; ++b)
      for (Index t = detail::length_of(lengths, b, T); t < T; ++t) std::fill_n(d + (b * T + t) * C, C, Real(0));
    dy = d;
  }
  // The scratch gradients are written (=), not accumulated: no zeroing pass.
  Real* dctx = detail::scratch<Real>(detail::kAttnDctx, n);
  Real* dq = detail::scratch<Real>(detail::kAttnDq, n);
  Real* dk = detail::scratch<Real>(detail::kAttnDk, n);
  Real* dv = detail::scratch<Real>(detail::kAttnDv, n);
  // out = ctx·woᵀ + bo:  dctx = dy·wo (=), dwo += dyᵀ·ctx, dbo += Σ dy
  gemm<Real>(false, false, N, C, C, Real(1), dy, C, params.wo, C, Real(0), dctx, C);
  linear_backward(static_cast<Real*>(nullptr), grads.dwo, grads.dbo, dy, acts.ctx, params.wo, N, C, C);
  if constexpr (std::is_same_v<Real, float>) {
    sdpa_backward_gemm(dq, dk, dv, dctx, acts.q, acts.k, acts.v, acts.att, lengths, B, T, C, H, causal, true);
  } else {
    for (Real* d : {dq, dk, dv}) std::fill_n(d, n, Real(0));
    sdpa_backward_loops(dq, dk, dv, dctx, acts.q, acts.k, acts.v, acts.att, lengths, B, T, C, H, causal);
  }
  linear_backward(dinp, grads.dwv, grads.dbv, dv, inp, params.wv, N, C, C);
  linear_backward(dinp, grads.dwk, grads.dbk, dk, inp, params.wk, N, C, C);
  linear_backward(dinp, grads.dwq, grads.dbq, dq, inp, params.wq, N, C, C);
}

#define NL_INSTANTIATE(Real)                                                                                   \
  template void sdpa_forward<Real>(Real*, Real*, const Real*, const Real*, const Real*, std::span<const Index>, \
                                   Index, Index, Index, Index, bool);                                          \
  template void sdpa_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, const Real*,    \
                                    const Real*, std::span<const Index>, Index, Index, Index, Index, bool);     \
  template void attention_forward<Real>(Real*, const AttentionActs<Real>&, const Real*,                        \
                                        const AttentionParams<Real>&, std::span<const Index>, Index, Index,    \
                                        Index, Index, bool);                                                   \
  template void attention_backward<Real>(Real*, const AttentionGrads<Real>&, const Real*, const Real*,         \
                                         const AttentionParams<Real>&, const AttentionActs<Real>&,             \
                                         std::span<const Index>, Index, Index, Index, Index, bool);
NL_INSTANTIATE(float)
NL_INSTANTIATE(double)
#undef NL_INSTANTIATE

}  // namespace normlab::nn
