// Token embedding lookup and positions (learned table or fixed sinusoidal).
// See include/normlab/nn/layers.h.
#include <normlab/nn/layers.h>

#include <cmath>

#include "nn/checks.h"

namespace normlab::nn {

namespace {
void check_tokens(const std::int32_t* tokens, Index n, Index V) {
  for (Index i = 0; i < n; ++i)
    NL_CHECK(tokens[i] >= 0 && tokens[i] < V, "token_embedding: token {} at flat position {} is out of range [0, V = {})",
             tokens[i], i, V);
}
void check_sizes(const char* layer, Index B, Index T, Index C) {
  detail::check_size(layer, "B", B);
  detail::check_size(layer, "T", T);
  detail::check_size(layer, "C", C);
}
}  // namespace

template <typename Real>
void token_embedding_forward(Real* out, const std::int32_t* tokens, const Real* wte, Index B, Index T, Index C,
                             Index V) {
  // out is (B,T,C), tokens is (B,T), wte is (V,C)
  check_sizes("token_embedding", B, T, C);
  detail::check_size("token_embedding", "V", V);
  check_tokens(tokens, B * T, V);
  for (Index bt = 0; bt < B * T; ++bt) {
    const Real* row = wte + static_cast<Index>(tokens[bt]) * C;
    for (Index c = 0; c < C; ++c) out[bt * C + c] = row[c];
  }
}

template <typename Real>
void token_embedding_backward(Real* dwte, const Real* dout, const std::int32_t* tokens, Index B, Index T,
                              Index C, Index V) {
  // dwte is (V,C), dout is (B,T,C), tokens is (B,T). Serial scatter in (b,t) order: deterministic.
  check_sizes("token_embedding", B, T, C);
  detail::check_size("token_embedding", "V", V);
  check_tokens(tokens, B * T, V);
  for (Index bt = 0; bt < B * T; ++bt) {
    Real* row = dwte + static_cast<Index>(tokens[bt]) * C;
    for (Index c = 0; c < C; ++c) row[c] += dout[bt * C + c];
  }
}

template <typename Real>
void sinusoidal_positions(Real* pe, Index T, Index C) {
  // pe is (T,C); angle = t · 10000^(−2⌊j/2⌋/C), sin on even j, cos on odd j (computed in double)
  detail::check_size("sinusoidal_positions", "T", T);
  detail::check_size("sinusoidal_positions", "C", C);
  for (Index t = 0; t < T; ++t)
    for (Index j = 0; j < C; ++j) {
      const double inv_freq = std::pow(10000.0, -static_cast<double>(2 * (j / 2)) / static_cast<double>(C));
      const double angle = static_cast<double>(t) * inv_freq;
      pe[t * C + j] = static_cast<Real>(j % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
}

template <typename Real>
void position_forward(Real* out, const Real* inp, const Real* wpe, Index B, Index T, Index C) {
  // out, inp are (B,T,C), wpe is (T_max,C) with T_max ≥ T
  check_sizes("position", B, T, C);
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t)
      for (Index c = 0; c < C; ++c) out[(b * T + t) * C + c] = inp[(b * T + t) * C + c] + wpe[t * C + c];
}

template <typename Real>
void position_backward(Real* dinp, Real* dwpe, const Real* dout, Index B, Index T, Index C) {
  // dinp is (B,T,C) or null, dwpe is (T_max,C) or null, dout is (B,T,C)
  check_sizes("position", B, T, C);
  if (dinp)
    for (Index i = 0; i < B * T * C; ++i) dinp[i] += dout[i];
  if (dwpe)
    for (Index b = 0; b < B; ++b)
      for (Index t = 0; t < T; ++t)
        for (Index c = 0; c < C; ++c) dwpe[t * C + c] += dout[(b * T + t) * C + c];
}

#define NL_INSTANTIATE(Real)                                                                                   \
  template void token_embedding_forward<Real>(Real*, const std::int32_t*, const Real*, Index, Index, Index,     \
                                              Index);                                                          \
  template void token_embedding_backward<Real>(Real*, const Real*, const std::int32_t*, Index, Index, Index,    \
                                               Index);                                                         \
  template void sinusoidal_positions<Real>(Real*, Index, Index);                                               \
  template void position_forward<Real>(Real*, const Real*, const Real*, Index, Index, Index);                  \
  template void position_backward<Real>(Real*, Real*, const Real*, Index, Index, Index);
NL_INSTANTIATE(float)
NL_INSTANTIATE(double)
#undef NL_INSTANTIATE

}  // namespace normlab::nn
