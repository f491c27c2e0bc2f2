// Softmax cross-entropy over V classes per position, mean over the counted positions.
// See include/normlab/nn/layers.h.
#include <normlab/nn/layers.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/checks.h"
#include "parallel/parallel.h"

namespace normlab::nn {

namespace {

void check_loss(const std::int32_t* targets, std::span<const Index> lengths, Index B, Index T, Index V) {
  detail::check_size("cross_entropy", "B", B);
  detail::check_size("cross_entropy", "T", T);
  detail::check_size("cross_entropy", "V", V);
  detail::check_lengths("cross_entropy", lengths, B, T);
  for (Index i = 0; i < B * T; ++i)
    NL_CHECK(targets[i] < V, "cross_entropy: target {} at flat position {} is out of range [0, V = {}) "
             "(negative targets are ignored)", targets[i], i, V);
}

bool counted(const std::int32_t* targets, std::span<const Index> lengths, Index b, Index t, Index T) {
  return t < detail::length_of(lengths, b, T) && targets[b * T + t] >= 0;
}

Index count_positions(const std::int32_t* targets, std::span<const Index> lengths, Index B, Index T) {
  Index n = 0;
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t) n += counted(targets, lengths, b, t, T) ? 1 : 0;
  return n;
}

}  // namespace

template <typename Real>
double cross_entropy_forward(Real* probs, const Real* logits, const std::int32_t* targets,
                             std::span<const Index> lengths, Index B, Index T, Index V) {
  // probs, logits are (B,T,V); targets is (B,T)
  check_loss(targets, lengths, B, T, V);
  std::vector<double> row_loss(static_cast<std::size_t>(B * T), 0.0);
  // One chunk per position; the softmax is computed in double and each probability rounded once:
  //   m = max_v z_v,  S = Σ_v exp(z_v − m),  p_v = exp(z_v − m)/S,  −log p_y = log S − (z_y − m)
  parallel::parallel_for(B * T, [&](Index bt) {
    const Real* z = logits + bt * V;
    Real* p = probs + bt * V;
    double m = -INFINITY;
    for (Index v = 0; v < V; ++v) m = std::max(m, static_cast<double>(z[v]));
    thread_local std::vector<double> e;  // exp(z_v − m), computed once per entry
    if (e.size() < static_cast<std::size_t>(V)) e.resize(static_cast<std::size_t>(V));
    double sum = 0;
    for (Index v = 0; v < V; ++v) {
      e[static_cast<std::size_t>(v)] = std::exp(static_cast<double>(z[v]) - m);
      sum += e[static_cast<std::size_t>(v)];
    }
    for (Index v = 0; v < V; ++v) p[v] = static_cast<Real>(e[static_cast<std::size_t>(v)] / sum);
    if (counted(targets, lengths, bt / T, bt % T, T))
      row_loss[static_cast<std::size_t>(bt)] = std::log(sum) - (static_cast<double>(z[targets[bt]]) - m);
  });
  const Index n = count_positions(targets, lengths, B, T);
  if (n == 0) return 0.0;
  double total = 0;  // summed in position order: the same bits for any thread count
  for (double l : row_loss) total += l;
  return total / static_cast<double>(n);
}

template <typename Real>
void cross_entropy_backward(Real* dlogits, const Real* probs, const std::int32_t* targets,
                            std::span<const Index> lengths, Index B, Index T, Index V, double dloss) {
  // dlogits, probs are (B,T,V); targets is (B,T)
  check_loss(targets, lengths, B, T, V);
  const Index n = count_positions(targets, lengths, B, T);
  if (n == 0) return;
  const double w = dloss / static_cast<double>(n);
  parallel::parallel_for(B * T, [&](Index bt) {
    if (!counted(targets, lengths, bt / T, bt % T, T)) return;
    const Real* p = probs + bt * V;
    Real* dz = dlogits + bt * V;
    const Index y = targets[bt];
    for (Index v = 0; v < V; ++v)
      dz[v] += static_cast<Real>(w * (static_cast<double>(p[v]) - (v == y ? 1.0 : 0.0)));
  });
}

#define NL_INSTANTIATE(Real)                                                                                     \
  template double cross_entropy_forward<Real>(Real*, const Real*, const std::int32_t*, std::span<const Index>,    \
                                              Index, Index, Index);                                              \
  template void cross_entropy_backward<Real>(Real*, const Real*, const std::int32_t*, std::span<const Index>,     \
                                             Index, Index, Index, double);
NL_INSTANTIATE(float)
NL_INSTANTIATE(double)
#undef NL_INSTANTIATE

}  // namespace normlab::nn
