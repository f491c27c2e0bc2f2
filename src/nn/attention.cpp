// Multi-head self-attention: q, k, v, o projections around scaled dot-product attention, causal or
// bidirectional, with an optional padding mask. See include/normlab/nn/layers.h for the contract.
#include <normlab/nn/layers.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "nn/checks.h"
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

template <typename Real>
void sdpa_forward(Real* ctx, Real* att, const Real* q, const Real* k, const Real* v,
                  std::span<const Index> lengths, Index B, Index T, Index C, Index H, bool causal) {
  // ctx is (B,T,C), att is (B,H,T,T); q, k, v are (B,T,C)
  check_attention(B, T, C, H, lengths);
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
void sdpa_backward(Real* dq, Real* dk, Real* dv, const Real* dctx, const Real* q, const Real* k,
                   const Real* v, const Real* att, std::span<const Index> lengths, Index B, Index T,
                   Index C, Index H, bool causal) {
  // dq, dk, dv are (B,T,C) (+=); dctx, q, k, v are (B,T,C); att is (B,H,T,T)
  check_attention(B, T, C, H, lengths);
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
  const Index N = B * T;
  const std::size_t n = static_cast<std::size_t>(N * C);
  // dout at padded rows is ignored: take a copy with those rows zeroed when there is padding.
  std::vector<Real> dout_real;
  const Real* dy = dout;
  if (!lengths.empty()) {
    dout_real.assign(dout, dout + n);
    for (Index b = 0; b < B; ++b)
      for (Index t = detail::length_of(lengths, b, T); t < T; ++t)
        std::fill_n(dout_real.data() + (b * T + t) * C, C, Real(0));
    dy = dout_real.data();
  }
  std::vector<Real> dctx(n, Real(0)), dq(n, Real(0)), dk(n, Real(0)), dv(n, Real(0));
  linear_backward(dctx.data(), grads.dwo, grads.dbo, dy, acts.ctx, params.wo, N, C, C);
  sdpa_backward(dq.data(), dk.data(), dv.data(), dctx.data(), acts.q, acts.k, acts.v, acts.att, lengths, B, T, C,
                H, causal);
  linear_backward(dinp, grads.dwv, grads.dbv, dv.data(), inp, params.wv, N, C, C);
  linear_backward(dinp, grads.dwk, grads.dbk, dk.data(), inp, params.wk, N, C, C);
  linear_backward(dinp, grads.dwq, grads.dbq, dq.data(), inp, params.wq, N, C, C);
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
