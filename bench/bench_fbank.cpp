// bench/bench_fbank.cpp — real-time factor of normlab's fbank on one core, features only.
//
//   normlab_bench_fbank FILES.txt [--repeats R] [Kaldi-style options: --num-mel-bins N --snip-edges=false
//                                  --window-type T --sample-frequency F --vtln-warp A]
//
// Reads every WAV of FILES.txt (one path per line) into memory, then computes the features of all files
// R times (default 5) on the calling thread with one speech::FbankExtractor (set-up once, as
// `normlab fbank --list` does per thread), dither 0, and prints for the best repeat the real-time factor
// RTF = compute time / audio time, both as wall-clock time and as the thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID; on a shared machine the CPU time is the steadier of the two). The printed
// checksum (sum of all features) makes sure the work is not optimized away and lets two builds be compared.
// bench/fbank_torchaudio.py measures torchaudio.compliance.kaldi.fbank the same way on the same list.
#include <normlab/error.h>
#include <normlab/speech/fbank.h>
#include <normlab/speech/wav.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

bool parse_bool(const std::string& v) { return v == "true" || v == "1"; }

}  // namespace

int main(int argc, char** argv) try {
  using namespace normlab;
  NL_CHECK(argc >= 2, "usage: {} FILES.txt [--repeats R] [--num-mel-bins N] [--snip-edges=B] "
           "[--window-type T] [--sample-frequency F] [--vtln-warp A]", argv[0]);
  speech::FbankOptions o;
  o.frame_opts.dither = 0.0f;
  int repeats = 5;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i], v;
    if (const auto eq = a.find('='); eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (i + 1 < argc) {
      v = argv[++i];
    }
    if (a == "--repeats") repeats = std::stoi(v);
    else if (a == "--num-mel-bins") o.mel_opts.num_bins = std::stoi(v);
    else if (a == "--snip-edges") o.frame_opts.snip_edges = parse_bool(v);
    else if (a == "--window-type") o.frame_opts.window_type = v;
    else if (a == "--sample-frequency") o.frame_opts.samp_freq = std::stof(v);
    else if (a == "--vtln-warp") o.vtln_warp = std::stof(v);
    else NL_CHECK(false, "unknown option {}", a);
  }
  std::ifstream list(argv[1]);
  NL_CHECK(list.good(), "cannot open {}", argv[1]);
  std::vector<speech::Waveform> waves;
  double audio_seconds = 0;
  for (std::string line; std::getline(list, line);) {
    if (line.empty() || line[0] == '#') continue;
    waves.push_back(speech::read_wav(line, {.expected_samp_freq = o.frame_opts.samp_freq}));
    audio_seconds += static_cast<double>(waves.back().samples.size()) / waves.back().samp_freq;
  }
  NL_CHECK(!waves.empty(), "{} names no files", argv[1]);
  speech::FbankExtractor extractor(o);
  double best_wall = 1e30, best_cpu = 1e30, checksum = 0;
  std::int64_t frames = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    double sum = 0;
    std::int64_t n = 0;
    for (const speech::Waveform& w : waves) {
      const Tensor f = extractor.Compute(w.samples, w.samp_freq);
      sum += static_cast<double>(f[0]) + f[f.numel() - 1];
      n += f.size(0);
    }
    const double cpu = thread_cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_wall = std::min(best_wall, wall);
    best_cpu = std::min(best_cpu, cpu);
    checksum = sum;
    frames = n;
  }
  std::printf(
      "normlab fbank: %zu files, %.1f s of audio, %lld frames, %d bins; best of %d: RTF %.6f wall, %.6f "
      "thread CPU (%.2f us per frame CPU); checksum %.6g\n",
      waves.size(), audio_seconds, static_cast<long long>(frames), o.mel_opts.num_bins, repeats,
      best_wall / audio_seconds, best_cpu / audio_seconds, 1e6 * best_cpu / static_cast<double>(frames),
      checksum);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
