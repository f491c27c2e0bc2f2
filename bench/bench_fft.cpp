// The power spectrum |X_k|², k = 0..N/2, of one real frame in double, the step of the fbank that needs an
// FFT: normlab's power-of-two real FFT (src/speech/real_fft.h) against the BSD-licensed FFT libraries
// Debian ships: kissfft (libkissfft-dev, the C++ template kissfft.hh, real-input transform) and, when
// its header is installed, pocketfft (pocketfft_hdronly, shipped inside python3-pythran). It measures
// why the fbank does not use a library FFT for power-of-two lengths (docs/PERFORMANCE.md, "Speech
// front end").
//
//   build/release/bench/normlab_bench_fft                # Google Benchmark flags work as usual
//
// Names: BM_PowerSpectrum/<impl>/<N>, impl ∈ {normlab-scalar, normlab-avx2, normlab-avx512, kissfft,
// pocketfft}. normlab-<isa> is the same source compiled for that instruction set with the GCC `target`
// attribute, as src/speech/fbank.cpp does (all three give the same bits); the libraries are compiled for
// the baseline x86-64 set, as Debian's packages are. Every variant includes the |X_k|² loop.
#include <benchmark/benchmark.h>
#include <normlab/simd.h>

#include <complex>
#include <kissfft/kissfft.hh>
#include <random>
#include <string>
#include <vector>

#include "speech/real_fft.h"
#ifdef NORMLAB_POCKETFFT_HPP
#include NORMLAB_POCKETFFT_HPP
#endif

namespace {

using normlab::speech::detail::RealFftPow2;

std::vector<double> Frame(int n) {
  std::mt19937 rng(1);
  std::normal_distribution<double> d;
  std::vector<double> x(static_cast<std::size_t>(n));
  for (double& v : x) v = 1000 * d(rng);
  return x;
}

void PowerScalar(RealFftPow2& f, const double* x, double* p) {
  f.PowerSpectrum(x, p);
}
[[gnu::target("avx2")]] void PowerAvx2(RealFftPow2& f, const double* x, double* p) {
  f.PowerSpectrum(x, p);
}
[[gnu::target("avx512f,prefer-vector-width=512")]] void PowerAvx512(RealFftPow2& f, const double* x,
                                                                    double* p) {
  f.PowerSpectrum(x, p);
}

void BM_Normlab(benchmark::State& state, int n, normlab::Isa isa) {
  if (!normlab::isa_supported(isa)) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  auto fn = isa == normlab::Isa::kScalar ? PowerScalar : isa == normlab::Isa::kAvx2 ? PowerAvx2 : PowerAvx512;
  RealFftPow2 fft(n);
  const std::vector<double> x = Frame(n);
  std::vector<double> p(static_cast<std::size_t>(n / 2 + 1));
  for (auto _ : state) {
    fn(fft, x.data(), p.data());
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
}

void BM_Kissfft(benchmark::State& state, int n) {
  kissfft<double> plan(static_cast<std::size_t>(n / 2), false);
  const std::vector<double> x = Frame(n);
  std::vector<std::complex<double>> out(static_cast<std::size_t>(n / 2));
  std::vector<double> p(static_cast<std::size_t>(n / 2 + 1));
  for (auto _ : state) {
    plan.transform_real(x.data(), out.data());  // out[0] = (X_0, X_{N/2}); out[k] = X_k, 0 < k < N/2
    p[0] = out[0].real() * out[0].real();
    p[static_cast<std::size_t>(n / 2)] = out[0].imag() * out[0].imag();
    for (int k = 1; k < n / 2; ++k)
      p[static_cast<std::size_t>(k)] = std::norm(out[static_cast<std::size_t>(k)]);
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
}

#ifdef NORMLAB_POCKETFFT_HPP
void BM_Pocketfft(benchmark::State& state, int n) {
  pocketfft::detail::rfftp<double> plan(static_cast<std::size_t>(n));
  const std::vector<double> x = Frame(n);
  std::vector<double> buf(static_cast<std::size_t>(n)), p(static_cast<std::size_t>(n / 2 + 1));
  for (auto _ : state) {
    std::copy(x.begin(), x.end(), buf.begin());  // in place: r0, r1, i1, r2, i2, ..., r_{N/2}
    plan.exec(buf.data(), 1.0, true);
    p[0] = buf[0] * buf[0];
    for (int k = 1; k < n / 2; ++k) {
      const double re = buf[static_cast<std::size_t>(2 * k - 1)], im = buf[static_cast<std::size_t>(2 * k)];
      p[static_cast<std::size_t>(k)] = re * re + im * im;
    }
    p[static_cast<std::size_t>(n / 2)] =
        buf[static_cast<std::size_t>(n - 1)] * buf[static_cast<std::size_t>(n - 1)];
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  for (int n : {256, 512, 1024}) {
    auto name = [n](const char* impl) {
      std::string r = "BM_PowerSpectrum/";
      r += impl;
      r += '/';
      r += std::to_string(n);
      return r;
    };
    benchmark::RegisterBenchmark(name("normlab-scalar").c_str(), BM_Normlab, n, normlab::Isa::kScalar);
    benchmark::RegisterBenchmark(name("normlab-avx2").c_str(), BM_Normlab, n, normlab::Isa::kAvx2);
    benchmark::RegisterBenchmark(name("normlab-avx512").c_str(), BM_Normlab, n, normlab::Isa::kAvx512);
    benchmark::RegisterBenchmark(name("kissfft").c_str(), BM_Kissfft, n);
#ifdef NORMLAB_POCKETFFT_HPP
    benchmark::RegisterBenchmark(name("pocketfft").c_str(), BM_Pocketfft, n);
#endif
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
