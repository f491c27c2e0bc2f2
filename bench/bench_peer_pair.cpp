// A paired timing of normlab's LayerNorm against oneDNN's and against a streaming copy of the same bytes,
// for issue 6's "faster than both peers" and "of copy" targets. normlab_bench times each implementation in
// its own benchmark, seconds apart; on a host whose memory bandwidth drifts (docs/PERFORMANCE.md, the Zen 5
// sessions: the out-of-cache copy at 1 thread between 7.7 and 15 ms for the same 256 MiB within an hour)
// their ratio moves with it. Here every round times the three back to back, each in its turn first
// (round r starts with implementation r mod 3), on the same buffers (x, dy read; y or dx written by all
// three), and the quartiles of the per-round ratios are printed. Each timed call follows an untimed call of
// the same implementation, so that it finds the caches as the harness's loops do (its own last call's
// state: the copy's streaming stores, for one, leave y out of the cache, which an "in L3" call after it
// would otherwise pay for).
//
// Forward: y, mean, rstd (oneDNN: variance) from x, γ, β. Backward: dx, dγ, dβ from dy, x, γ and the
// forward's saved statistics (normlab: layer_norm_backward_saved; oneDNN: its mean and variance), the
// comparison normlab_bench's BM_LayerNormBwdSaved makes. Copy: y = x with streaming stores, one contiguous
// part per thread (bench_copy.h), as BM_CopyStream: out of cache the faster copy; in L3 the copy with
// ordinary stores can be faster, and normlab_bench's "of copy" takes the better of the two, so there the
// fraction here is the higher one. Bytes as normlab_bench counts them: the forward and the copy 2·4·R·D, the
// backward 3·4·R·D.
//
//   normlab_bench_peer_pair [--row] R D [THREADS [ROUNDS]]   # defaults: 1 thread, 30 rounds; --row: one
//                                                            # markdown table row per operation
//   normlab_bench_peer_pair 524288 64 1               # normlab_bench's out-of-cache shape at D = 64
//   normlab_bench_peer_pair 8192 64 2 300             # its "in L3" shape, 2 threads
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/simd.h>
#include <normlab/tensor.h>
#include <omp.h>

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "bench_copy.h"
#include "bench_onednn.h"
#include "bench_support.h"

namespace {

using namespace normlab;
using bench::parse_positive;
using bench::quantile;
using bench::time_us;
using dnnl::memory;
namespace onednn = bench::onednn;

// The three implementations' per-round times of one operation.
struct Rounds {
  std::vector<double> normlab, onednn, copy;
};

// `bytes`: what the operation moves; `copy_bytes`: what the copy moves (2·4·R·D). "Of copy" compares rates:
// (bytes / normlab's time) / (copy_bytes / the copy's time), round by round. `row`: one markdown table row
// (scripts/bench) instead of the two lines of text.
void print(const char* what, const Rounds& t, double bytes, double copy_bytes, bool row, const char* shape,
           int threads) {
  std::vector<double> peer, of_copy;
  for (std::size_t i = 0; i < t.normlab.size(); ++i) {
    peer.push_back(t.onednn[i] / t.normlab[i]);
    of_copy.push_back((bytes / t.normlab[i]) / (copy_bytes / t.copy[i]));
  }
  const double tn = quantile(t.normlab, 0.5), to = quantile(t.onednn, 0.5), tc = quantile(t.copy, 0.5);
  if (row) {
    std::printf("| %s | %d | %s | %.2f (%.2f–%.2f) | %.2f (%.2f–%.2f) | %.1f / %.1f / %.1f |\n", shape,
                threads, what, quantile(peer, 0.5), quantile(peer, 0.25), quantile(peer, 0.75),
                quantile(of_copy, 0.5), quantile(of_copy, 0.25), quantile(of_copy, 0.75), tn, to, tc);
    return;
  }
  auto gbs = [](double b, double us) { return b / (us * 1e3); };
  std::printf(
      "%-9s medians: normlab %9.1f us (%5.1f GB/s), oneDNN %9.1f us (%5.1f GB/s), copy %9.1f us (%5.1f "
      "GB/s)\n",
      what, tn, gbs(bytes, tn), to, gbs(bytes, to), tc, gbs(copy_bytes, tc));
  std::printf(
      "%-9s per round, p25 / median / p75: oneDNN's time over normlab's %.3f / %.3f / %.3f; normlab of copy "
      "%.3f / %.3f / %.3f\n",
      "", quantile(peer, 0.25), quantile(peer, 0.5), quantile(peer, 0.75), quantile(of_copy, 0.25),
      quantile(of_copy, 0.5), quantile(of_copy, 0.75));
}

int run(int argc, char** argv) {
  const bool row = argc > 1 && std::string_view(argv[1]) == "--row";
  if (row) {
    --argc;
    ++argv;
  }
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: normlab_bench_peer_pair [--row] R D [THREADS [ROUNDS]]\n");
    return 2;
  }
  const Index R = parse_positive(argv[1], "R"), D = parse_positive(argv[2], "D");
  const int threads = argc > 3 ? static_cast<int>(parse_positive(argv[3], "THREADS")) : 1;
  const int rounds = argc > 4 ? static_cast<int>(parse_positive(argv[4], "ROUNDS")) : 30;
  set_num_threads(threads);
  omp_set_num_threads(threads);  // oneDNN (OpenMP runtime)

  constexpr double kEps = 1e-5;
  Tensor x({R, D}), dy({R, D}), out({R, D}), w({D}), b({D}), dw({D}), db({D}), mean({R}), rstd({R});
  bench::FillUniform(x.data(), x.numel(), 1, -1.0f, 3.0f);
  bench::FillUniform(dy.data(), dy.numel(), 2, -1.0f, 3.0f);
  for (Index i = 0; i < D; ++i) {
    w.data()[i] = 1.0f + 0.01f * static_cast<float>(i);
    b.data()[i] = 0.1f;
  }
  NormStats saved;
  layer_norm_forward(out.view(), mean.view(), rstd.view(), x.cview(), w.cview(), b.cview(), Axes{1}, kEps,
                     &saved);

  const onednn::LayerNormDescs descs{memory::desc({R, D}, memory::data_type::f32, memory::format_tag::ab),
                                     memory::desc({R}, memory::data_type::f32, memory::format_tag::a),
                                     memory::desc({D}, memory::data_type::f32, memory::format_tag::a), kEps};
  std::vector<float> dmean(static_cast<std::size_t>(R)), dvar(static_cast<std::size_t>(R));
  std::vector<float> dgamma(static_cast<std::size_t>(D)), dbeta(static_cast<std::size_t>(D));
  const onednn::LayerNormBuffers bufs{x.data(),    out.data(), dy.data(), out.data(),    dmean.data(),
                                      dvar.data(), w.data(),   b.data(),  dgamma.data(), dbeta.data()};
  const onednn::Call dfwd = onednn::LayerNormForward(descs, bufs);
  const onednn::Call dbwd = onednn::LayerNormBackward(descs, bufs);
  const std::vector<std::function<void()>> fwd = {
      [&] {
        layer_norm_forward(out.view(), mean.view(), rstd.view(), x.cview(), w.cview(), b.cview(), Axes{1},
                           kEps);
      },
      [&] { dfwd.Run(); },
      [&] { bench::ParallelCopy(bench::StreamCopy(), out.data(), x.data(), x.numel(), threads); }};
  const std::vector<std::function<void()>> bwd = {
      [&] {
        layer_norm_backward_saved(out.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), saved);
      },
      [&] { dbwd.Run(); }, fwd[2]};
  Rounds tf, tb;
  auto round = [](int r, const std::vector<std::function<void()>>& ops, Rounds& t) {
    double us[3];
    for (int k = 0; k < 3; ++k) {
      const std::size_t i = static_cast<std::size_t>((r + k) % 3);
      ops[i]();  // untimed: pages touched, first-call work done, the caches as this implementation leaves
                 // them
      us[i] = time_us(ops[i]);
    }
    t.normlab.push_back(us[0]);
    t.onednn.push_back(us[1]);
    t.copy.push_back(us[2]);
  };
  for (int r = 0; r < rounds; ++r) {
    round(r, fwd, tf);
    round(r, bwd, tb);
  }
  const double n = static_cast<double>(x.numel());
  const std::string shape = std::to_string(R) + "x" + std::to_string(D);
  if (!row)
    std::printf(
        "LayerNorm of [%lld,%lld] over the last axis: normlab (%s), oneDNN (%s), streaming copy; %d threads, "
        "%d rounds\n",
        static_cast<long long>(R), static_cast<long long>(D), isa_name(active_isa()), dfwd.impl.c_str(),
        threads, rounds);
  print("forward", tf, 2.0 * 4.0 * n, 2.0 * 4.0 * n, row, shape.c_str(), threads);
  print("backward", tb, 3.0 * 4.0 * n, 2.0 * 4.0 * n, row, shape.c_str(), threads);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return normlab::bench::run_tool("normlab_bench_peer_pair", run, argc, argv);
}
