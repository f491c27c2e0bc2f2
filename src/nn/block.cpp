// src/nn/block.cpp — norm layers and Transformer blocks: forward and its literal reverse (llm.c style).
//
// Every activation is (N,C) with N = B·T unless stated. Each Block::backward below reads bottom-up the
// lines of its Block::forward, one to one. Formulas and citations: docs/placements.md.
#include "nn/block.h"
#include "nn/elementwise.h"
#include "nn/scratch.h"

#include <normlab/error.h>

#include <algorithm>
#include <cmath>

namespace normlab::nn {

namespace {

template <typename Real>
void ensure(std::vector<Real>& v, Index n) {
  if (static_cast<Index>(v.size()) != n) v.assign(static_cast<std::size_t>(n), Real(0));
}

template <typename Real>
Real* ptr(const std::vector<ParamEntry<Real>>& p, int i) {
  return i < 0 ? nullptr : p[static_cast<std::size_t>(i)].data;
}
template <typename Real>
Real* gptr(const std::vector<ParamEntry<Real>>& p, int i) {
  return i < 0 ? nullptr : p[static_cast<std::size_t>(i)].grad;
}

// out = a·x + b·y (out may alias x or y)
template <typename Real>
void axpby(Real* out, double a, const Real* x, double b, const Real* y, Index n) {
  for (Index i = 0; i < n; ++i) out[i] = static_cast<Real>(a * x[i] + b * y[i]);
}
// dst += a·src
template <typename Real>
void add_scaled(Real* dst, double a, const Real* src, Index n) {
  if (a == 1.0) {
    for (Index i = 0; i < n; ++i) dst[i] += src[i];
  } else {
    for (Index i = 0; i < n; ++i) dst[i] += static_cast<Real>(a * src[i]);
  }
}

}  // namespace

// ---- Norm -----------------------------------------------------------------------------------------

template <typename Real>
void Norm<Real>::forward(Real* out, const Real* inp, const std::vector<ParamEntry<Real>>& p, Index N,
                         Index C, std::span<const Index> lengths, Index T) const {
  switch (kind) {
    case NormKind::kLayerNorm:
      layernorm_forward<Real>(out, nullptr, nullptr, inp, ptr(p, weight), ptr(p, bias), N, C, eps);
      break;
    case NormKind::kRmsNorm:
      rmsnorm_forward<Real>(out, nullptr, inp, ptr(p, weight), N, C, eps);
      break;
    case NormKind::kDyT:
      dyt_forward<Real>(out, inp, ptr(p, alpha), ptr(p, weight), ptr(p, bias), N, C);
      break;
    case NormKind::kBatchNorm: {
      if (T <= 0) T = N;  // no sequence given: N rows of one sequence
      batchnorm_forward<Real>(out, running_mean, running_var, inp, ptr(p, weight), ptr(p, bias), lengths,
                              N / T, T, C, training, momentum, eps, bn_kernels);
      break;
    }
  }
  if (scale != 1.0)
    for (Index i = 0; i < N * C; ++i) out[i] = static_cast<Real>(scale * out[i]);
}

template <typename Real>
void Norm<Real>::backward(Real* dinp, const Real* dout, const Real* inp, const std::vector<ParamEntry<Real>>& p,
                          Index N, Index C, std::span<const Index> lengths, Index T) const {
  if (scale != 1.0) {  // out = scale·norm(inp): d norm = scale·dout
    Real* scaled = detail::scratch<Real>(detail::kNormScaled, N * C);
    for (Index i = 0; i < N * C; ++i) scaled[i] = static_cast<Real>(scale * dout[i]);
    dout = scaled;
  }
  switch (kind) {
    case NormKind::kLayerNorm:
      layernorm_backward<Real>(dinp, gptr(p, weight), gptr(p, bias), dout, inp, ptr(p, weight), N, C, eps);
      break;
    case NormKind::kRmsNorm:
      rmsnorm_backward<Real>(dinp, gptr(p, weight), dout, inp, ptr(p, weight), N, C, eps);
      break;
    case NormKind::kDyT:
      dyt_backward<Real>(dinp, gptr(p, alpha), gptr(p, weight), gptr(p, bias), dout, inp, ptr(p, alpha),
                         ptr(p, weight), N, C);
      break;
    case NormKind::kBatchNorm: {
      if (T <= 0) T = N;
      batchnorm_backward<Real>(dinp, gptr(p, weight), gptr(p, bias), dout, inp, ptr(p, weight), running_mean,
                               running_var, lengths, N / T, T, C, training, eps, bn_kernels);
      break;
    }
  }
}

// ---- Sublayers ------------------------------------------------------------------------------------

// Attention: parameters attn_params + 0..7 = q.weight, q.bias, k.weight, k.bias, v.weight, v.bias,
// o.weight, o.bias.
template <typename Real>
void Block<Real>::attn_forward(Real* out, const Real* inp, const std::vector<ParamEntry<Real>>& p, const Shape& s,
                               std::span<const Index> lengths) {
  const Index N = s.N(), C = s.C;
  ensure(acts_.q, N * C), ensure(acts_.k, N * C), ensure(acts_.v, N * C), ensure(acts_.ctx, N * C);
  ensure(acts_.att, s.B * s.H * s.T * s.T);
  const int i = attn_params;
  const AttentionParams<Real> ap{ptr(p, i), ptr(p, i + 1), ptr(p, i + 2), ptr(p, i + 3),
                                 ptr(p, i + 4), ptr(p, i + 5), ptr(p, i + 6), ptr(p, i + 7)};
  const AttentionActs<Real> aa{acts_.q.data(), acts_.k.data(), acts_.v.data(), acts_.att.data(), acts_.ctx.data()};
  attention_forward(out, aa, inp, ap, lengths, s.B, s.T, C, s.H, causal);
}

template <typename Real>
void Block<Real>::attn_backward(Real* dinp, const Real* dout, const Real* inp, const std::vector<ParamEntry<Real>>& p,
                                const Shape& s, std::span<const Index> lengths) {
  const int i = attn_params;
  const AttentionParams<Real> ap{ptr(p, i), ptr(p, i + 1), ptr(p, i + 2), ptr(p, i + 3),
                                 ptr(p, i + 4), ptr(p, i + 5), ptr(p, i + 6), ptr(p, i + 7)};
  const AttentionGrads<Real> ag{gptr(p, i), gptr(p, i + 1), gptr(p, i + 2), gptr(p, i + 3),
                                gptr(p, i + 4), gptr(p, i + 5), gptr(p, i + 6), gptr(p, i + 7)};
  const AttentionActs<Real> aa{acts_.q.data(), acts_.k.data(), acts_.v.data(), acts_.att.data(), acts_.ctx.data()};
  attention_backward(dinp, ag, dout, inp, ap, aa, lengths, s.B, s.T, s.C, s.H, causal);
}

// FFN: parameters ffn_params + 0..3 = w1.weight, w1.bias, w2.weight, w2.bias.
template <typename Real>
void Block<Real>::ffn_forward_(Real* out, const Real* inp, const std::vector<ParamEntry<Real>>& p, const Shape& s) {
  ensure(acts_.h, s.N() * s.F), ensure(acts_.a, s.N() * s.F);
  const int i = ffn_params;
  ffn_forward(out, acts_.h.data(), acts_.a.data(), inp, ptr(p, i), ptr(p, i + 1), ptr(p, i + 2), ptr(p, i + 3),
              s.N(), s.C, s.F, act);
}

template <typename Real>
void Block<Real>::ffn_backward_(Real* dinp, const Real* dout, const Real* inp, const std::vector<ParamEntry<Real>>& p,
                                const Shape& s) {
  const int i = ffn_params;
  ffn_backward(dinp, gptr(p, i), gptr(p, i + 1), gptr(p, i + 2), gptr(p, i + 3), dout, inp, acts_.h.data(),
               acts_.a.data(), ptr(p, i), ptr(p, i + 2), s.N(), s.C, s.F, act);
}

// ---- Block forward ----------------------------------------------------------------------------------
//
// norms, per style:  kPost: [norm1 (after attention), norm2 (after FFN)]   kPre: [norm1, norm2] (inputs of F)
//                    kSandwich: [norm1 (in), norm1_out, norm2 (in), norm2_out]   kB2T: [norm1, norm2]   kNone: []
//                    kSiamese: [norm1_post, norm1_pre, norm1_in, norm2_post, norm2_pre, norm2_in]

template <typename Real>
void Block<Real>::forward(Real* y, const Real* x, const std::vector<ParamEntry<Real>>& p, const Shape& s,
                          std::span<const Index> lengths) {
  const Index N = s.N(), C = s.C, NC = N * C;
  BlockActs<Real>& A = acts_;
  switch (style) {
    case BlockStyle::kPost:  // s1 = a·x + Attn(x); m = LN1(s1); s2 = a·m + FFN(m); y = LN2(s2)
      ensure(A.f1, NC), ensure(A.s1, NC), ensure(A.m, NC), ensure(A.f2, NC), ensure(A.s2, NC);
      attn_forward(A.f1.data(), x, p, s, lengths);
      axpby(A.s1.data(), alpha, x, 1.0, A.f1.data(), NC);
      norms[0].forward(A.m.data(), A.s1.data(), p, N, C, lengths, s.T);
      ffn_forward_(A.f2.data(), A.m.data(), p, s);
      axpby(A.s2.data(), alpha, A.m.data(), 1.0, A.f2.data(), NC);
      norms[1].forward(y, A.s2.data(), p, N, C, lengths, s.T);
      break;
    case BlockStyle::kPre:  // u1 = LN1(x); m = x + Attn(u1); u2 = LN2(m); y = m + FFN(u2)
      ensure(A.u1, NC), ensure(A.f1, NC), ensure(A.m, NC), ensure(A.u2, NC), ensure(A.f2, NC);
      norms[0].forward(A.u1.data(), x, p, N, C, lengths, s.T);
      attn_forward(A.f1.data(), A.u1.data(), p, s, lengths);
      residual_forward(A.m.data(), x, A.f1.data(), NC);
      norms[1].forward(A.u2.data(), A.m.data(), p, N, C, lengths, s.T);
      ffn_forward_(A.f2.data(), A.u2.data(), p, s);
      residual_forward(y, A.m.data(), A.f2.data(), NC);
      break;
    case BlockStyle::kSandwich:  // u1 = LN1(x); g1 = LN1o(Attn(u1)); m = x + g1; u2 = LN2(m); y = m + LN2o(FFN(u2))
      ensure(A.u1, NC), ensure(A.f1, NC), ensure(A.g1, NC), ensure(A.m, NC);
      ensure(A.u2, NC), ensure(A.f2, NC), ensure(A.g2, NC);
      norms[0].forward(A.u1.data(), x, p, N, C, lengths, s.T);
      attn_forward(A.f1.data(), A.u1.data(), p, s, lengths);
      norms[1].forward(A.g1.data(), A.f1.data(), p, N, C, lengths, s.T);
      residual_forward(A.m.data(), x, A.g1.data(), NC);
      norms[2].forward(A.u2.data(), A.m.data(), p, N, C, lengths, s.T);
      ffn_forward_(A.f2.data(), A.u2.data(), p, s);
      norms[3].forward(A.g2.data(), A.f2.data(), p, N, C, lengths, s.T);
      residual_forward(y, A.m.data(), A.g2.data(), NC);
      break;
    case BlockStyle::kB2T:  // s1 = x + Attn(x); m = LN1(s1); s2 = m + FFN(m) + x; y = LN2(s2)
      ensure(A.f1, NC), ensure(A.s1, NC), ensure(A.m, NC), ensure(A.f2, NC), ensure(A.s2, NC);
      attn_forward(A.f1.data(), x, p, s, lengths);
      residual_forward(A.s1.data(), x, A.f1.data(), NC);
      norms[0].forward(A.m.data(), A.s1.data(), p, N, C, lengths, s.T);
      ffn_forward_(A.f2.data(), A.m.data(), p, s);
      residual_forward(A.s2.data(), A.m.data(), A.f2.data(), NC);
      residual_forward(A.s2.data(), A.s2.data(), x, NC);  // the bottom-to-top connection
      norms[1].forward(y, A.s2.data(), p, N, C, lengths, s.T);
      break;
    case BlockStyle::kSiamese: {  // x, y = the two halves of the input; X, Y of the output
      const Real* xs = x;
      const Real* ys = x + NC;
      const double c = siamese_c;
      ensure(A.g1, NC), ensure(A.s1, NC), ensure(A.u1, NC), ensure(A.f1, NC), ensure(A.m, NC), ensure(A.ym, NC);
      ensure(A.g2, NC), ensure(A.s2, NC), ensure(A.u2, NC), ensure(A.f2, NC);
      norms[0].forward(A.g1.data(), xs, p, N, C, lengths, s.T);              // g1 = PostN1(x)
      norms[1].forward(A.s1.data(), ys, p, N, C, lengths, s.T);              // s1 = g1 + PreN1(y)
      residual_forward(A.s1.data(), A.s1.data(), A.g1.data(), NC);
      norms[2].forward(A.u1.data(), A.s1.data(), p, N, C, lengths, s.T);     // u1 = InN1(s1)
      attn_forward(A.f1.data(), A.u1.data(), p, s, lengths);   // z1 = Attn(u1)
      axpby(A.m.data(), 1.0, A.g1.data(), 1.0 / c, A.f1.data(), NC);  // m = g1 + z1/c
      residual_forward(A.ym.data(), ys, A.f1.data(), NC);      // ym = y + z1
      norms[3].forward(A.g2.data(), A.m.data(), p, N, C, lengths, s.T);      // g2 = PostN2(m)
      norms[4].forward(A.s2.data(), A.ym.data(), p, N, C, lengths, s.T);     // s2 = g2 + PreN2(ym)
      residual_forward(A.s2.data(), A.s2.data(), A.g2.data(), NC);
      norms[5].forward(A.u2.data(), A.s2.data(), p, N, C, lengths, s.T);     // u2 = InN2(s2)
      ffn_forward_(A.f2.data(), A.u2.data(), p, s);            // z2 = FFN(u2)
      axpby(y, 1.0, A.g2.data(), 1.0 / c, A.f2.data(), NC);    // X = g2 + z2/c
      residual_forward(y + NC, A.ym.data(), A.f2.data(), NC);  // Y = ym + z2
      break;
    }
    case BlockStyle::kNone:  // m = x + Attn(x); y = m + FFN(m)
      ensure(A.f1, NC), ensure(A.m, NC), ensure(A.f2, NC);
      attn_forward(A.f1.data(), x, p, s, lengths);
      residual_forward(A.m.data(), x, A.f1.data(), NC);
      ffn_forward_(A.f2.data(), A.m.data(), p, s);
      residual_forward(y, A.m.data(), A.f2.data(), NC);
      break;
  }
}

// ---- Block backward: the forward's lines in reverse ----------------------------------------------------

template <typename Real>
void Block<Real>::backward(Real* dx, const Real* dy, const Real* x, const std::vector<ParamEntry<Real>>& p,
                           const Shape& s, std::span<const Index> lengths) {
  const Index N = s.N(), C = s.C, NC = N * C;
  BlockActs<Real>& A = acts_;
  // (N,C) gradient temporaries, scratch slots shared by all blocks (src/nn/scratch.h): buffer(i) is
  // temporary i (contents unspecified), zeros(i) the same set to 0, copy(i, src) a copy of src.
  auto buffer = [&](int i) {
    return detail::scratch<Real>(static_cast<detail::ScratchSlot>(detail::kBlockGrad0 + i), NC);
  };
  auto zeros = [&](int i) {
    Real* b = buffer(i);
    detail::for_chunks(NC, [&](Index i0, Index i1) { std::fill(b + i0, b + i1, Real(0)); });
    return b;
  };
  auto copy = [&](int i, const Real* src) {
    Real* b = buffer(i);
    detail::for_chunks(NC, [&](Index i0, Index i1) { std::copy(src + i0, src + i1, b + i0); });
    return b;
  };
  switch (style) {
    case BlockStyle::kPost: {
      Real *ds2 = zeros(0), *dm = zeros(1), *ds1 = zeros(2);
      norms[1].backward(ds2, dy, A.s2.data(), p, N, C, lengths, s.T);           // y = LN2(s2)
      ffn_backward_(dm, ds2, A.m.data(), p, s);                   // s2 = a·m + FFN(m)
      add_scaled(dm, alpha, ds2, NC);
      norms[0].backward(ds1, dm, A.s1.data(), p, N, C, lengths, s.T);           // m = LN1(s1)
      attn_backward(dx, ds1, x, p, s, lengths);                   // s1 = a·x + Attn(x)
      add_scaled(dx, alpha, ds1, NC);
      break;
    }
    case BlockStyle::kPre: {
      Real *dm = copy(0, dy), *du2 = zeros(1), *du1 = zeros(2);
      ffn_backward_(du2, dy, A.u2.data(), p, s);                  // y = m + FFN(u2)  (dm = dy above)
      norms[1].backward(dm, du2, A.m.data(), p, N, C, lengths, s.T);            // u2 = LN2(m)
      residual_backward(dx, static_cast<Real*>(nullptr), dm, NC); // m = x + Attn(u1)
      attn_backward(du1, dm, A.u1.data(), p, s, lengths);
      norms[0].backward(dx, du1, x, p, N, C, lengths, s.T);                     // u1 = LN1(x)
      break;
    }
    case BlockStyle::kSandwich: {
      Real *dm = copy(0, dy), *df2 = zeros(1), *du2 = zeros(2), *df1 = zeros(3), *du1 = zeros(4);
      norms[3].backward(df2, dy, A.f2.data(), p, N, C, lengths, s.T);           // y = m + LN2o(f2)
      ffn_backward_(du2, df2, A.u2.data(), p, s);                 // f2 = FFN(u2)
      norms[2].backward(dm, du2, A.m.data(), p, N, C, lengths, s.T);            // u2 = LN2(m)
      residual_backward(dx, static_cast<Real*>(nullptr), dm, NC); // m = x + LN1o(f1)
      norms[1].backward(df1, dm, A.f1.data(), p, N, C, lengths, s.T);
      attn_backward(du1, df1, A.u1.data(), p, s, lengths);        // f1 = Attn(u1)
      norms[0].backward(dx, du1, x, p, N, C, lengths, s.T);                     // u1 = LN1(x)
      break;
    }
    case BlockStyle::kB2T: {
      Real *ds2 = zeros(0), *ds1 = zeros(1);
      norms[1].backward(ds2, dy, A.s2.data(), p, N, C, lengths, s.T);           // y = LN2(s2)
      residual_backward(dx, static_cast<Real*>(nullptr), ds2, NC); // s2 = m + FFN(m) + x
      Real* dm = copy(2, ds2);
      ffn_backward_(dm, ds2, A.m.data(), p, s);
      norms[0].backward(ds1, dm, A.s1.data(), p, N, C, lengths, s.T);           // m = LN1(s1)
      residual_backward(dx, static_cast<Real*>(nullptr), ds1, NC); // s1 = x + Attn(x)
      attn_backward(dx, ds1, x, p, s, lengths);
      break;
    }
    case BlockStyle::kSiamese: {
      const Real* xs = x;
      const Real* ys = x + NC;
      const Real* dX = dy;
      const Real* dY = dy + NC;
      const double c = siamese_c;
      Real *df2 = buffer(0), *du2 = zeros(1), *ds2 = zeros(2), *dm = zeros(3), *df1 = buffer(4), *du1 = zeros(5),
           *ds1 = zeros(6);
      axpby(df2, 1.0 / c, dX, 1.0, dY, NC);                        // X = g2 + z2/c; Y = ym + z2
      std::vector<Real> dg2(dX, dX + NC), dym(dY, dY + NC);
      ffn_backward_(du2, df2, A.u2.data(), p, s);                  // z2 = FFN(u2)
      norms[5].backward(ds2, du2, A.s2.data(), p, N, C, lengths, s.T);           // u2 = InN2(s2)
      residual_backward(dg2.data(), static_cast<Real*>(nullptr), ds2, NC);  // s2 = g2 + PreN2(ym)
      norms[4].backward(dym.data(), ds2, A.ym.data(), p, N, C, lengths, s.T);
      norms[3].backward(dm, dg2.data(), A.m.data(), p, N, C, lengths, s.T);      // g2 = PostN2(m)
      axpby(df1, 1.0 / c, dm, 1.0, dym.data(), NC);                // m = g1 + z1/c; ym = y + z1
      std::vector<Real> dg1(dm, dm + NC);
      residual_backward(dx + NC, static_cast<Real*>(nullptr), dym.data(), NC);
      attn_backward(du1, df1, A.u1.data(), p, s, lengths);         // z1 = Attn(u1)
      norms[2].backward(ds1, du1, A.s1.data(), p, N, C, lengths, s.T);           // u1 = InN1(s1)
      residual_backward(dg1.data(), static_cast<Real*>(nullptr), ds1, NC);  // s1 = g1 + PreN1(y)
      norms[1].backward(dx + NC, ds1, ys, p, N, C, lengths, s.T);
      norms[0].backward(dx, dg1.data(), xs, p, N, C, lengths, s.T);              // g1 = PostN1(x)
      break;
    }
    case BlockStyle::kNone: {
      Real* dm = copy(0, dy);
      ffn_backward_(dm, dy, A.m.data(), p, s);                     // y = m + FFN(m)
      residual_backward(dx, static_cast<Real*>(nullptr), dm, NC);  // m = x + Attn(x)
      attn_backward(dx, dm, x, p, s, lengths);
      break;
    }
  }
}

template <typename Real>
std::vector<const Real*> Block<Real>::norm_inputs(const Real* x) const {
  const BlockActs<Real>& A = acts_;
  switch (style) {
    case BlockStyle::kPost:
    case BlockStyle::kB2T:
      return {A.s1.data(), A.s2.data()};
    case BlockStyle::kPre:
      return {x, A.m.data()};
    case BlockStyle::kSandwich:
      return {x, A.f1.data(), A.m.data(), A.f2.data()};
    case BlockStyle::kSiamese:
      return {x, x + acts_.m.size(), A.s1.data(), A.m.data(), A.ym.data(), A.s2.data()};
    case BlockStyle::kNone:
      return {};
  }
  return {};
}

template struct Norm<float>;
template struct Norm<double>;
template class Block<float>;
template class Block<double>;

}  // namespace normlab::nn
