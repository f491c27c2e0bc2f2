// normlab/speech/fbank.h — Kaldi-compatible log-mel filterbank features (`compute-fbank-feats`).
//
// Follows the semantics of Kaldi's src/feat/feature-fbank.{h,cc} (FbankOptions, FbankComputer) and
// src/feat/online-feature.cc (OnlineGenericBaseFeature), restated in our own code. Option names and
// defaults mirror Kaldi's flags (--use-energy false --energy-floor 0 --raw-energy true --htk-compat false
// --use-log-fbank true --use-power true, plus FrameExtractionOptions and MelBanksOptions); a test pins them.
//
// Per frame (after feature_window.h's ProcessWindow): |FFT|² of the zero-padded window in double (a
// power-of-two length, the default, with src/speech/real_fft.h; any other length with kissfft) → mel banks
// (mel_banks.h, double) → the mel energy rounded to float, floored at FLT_EPSILON, log in float as Kaldi
// does (ln ε = −15.94). The FFT, mel sums and window kernel are compiled for the baseline instruction set
// and for AVX2 and chosen by NORMLAB_ISA (normlab/simd.h); both give the same bits. Input samples
// are on Kaldi's int16 scale (±32768). With use_energy the raw log-energy is feature 0 (htk_compat: the last
// feature); Dim() = num_bins + use_energy.
//
// Shapes: [T, F] (frames × features, layout kTF) or [F, T] (kFT); T = NumFrames(num_samples, frame_opts).
// Streaming: OnlineFbank fed the same samples in any chunking produces bitwise the same frames as
// ComputeFbank on the whole waveform (same code path, frames computed in order, dither drawn in order).
#pragma once

#include <normlab/speech/feature_window.h>
#include <normlab/speech/mel_banks.h>
#include <normlab/tensor.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace normlab::speech {

struct FbankOptions {
  FrameExtractionOptions frame_opts;
  MelBanksOptions mel_opts;   // num_bins 23 (compute-fbank-feats' default)
  bool use_energy = false;    // --use-energy: add the log-energy as an extra feature
  float energy_floor = 0.0f;  // --energy-floor: floor on the log-energy's argument (0 = none)
  bool raw_energy = true;     // --raw-energy: energy before pre-emphasis and windowing
  bool htk_compat = false;    // --htk-compat: energy last instead of first; HTK first-bin quirk
  bool use_log_fbank = true;  // --use-log-fbank
  bool use_power = true;      // --use-power: power (true) or magnitude (false) spectrum
  // --vtln-warp: the VTLN warp factor of the mel banks (mel_banks.h; 1 = none). A compute-fbank-feats flag
  // that Kaldi passes to FbankComputer::Compute per utterance; here it is one option for the whole run.
  float vtln_warp = 1.0f;

  void Validate() const;  // throws normlab::Error naming the bad option and its valid range
  std::string ToString() const;
};

enum class FeatureLayout { kTF, kFT };  // [frames, features] or [features, frames]

// Computes the features of one already-processed window (Kaldi's FbankComputer).
class FbankComputer {
 public:
  explicit FbankComputer(const FbankOptions& opts);  // validates opts; builds mel banks and the FFT plan
  ~FbankComputer();
  FbankComputer(const FbankComputer&) = delete;
  FbankComputer& operator=(const FbankComputer&) = delete;

  std::int32_t Dim() const;
  bool NeedRawLogEnergy() const { return opts_.use_energy && opts_.raw_energy; }
  const FbankOptions& GetOptions() const { return opts_; }
  const MelBanks& GetMelBanks() const { return mel_banks_; }

  // `window` holds PaddedWindowSize() processed samples (it is used as scratch); writes Dim() values.
  void Compute(float signal_raw_log_energy, std::span<double> window, std::span<float> feature);

 private:
  struct Fft;
  FbankOptions opts_;
  MelBanks mel_banks_;
  std::unique_ptr<Fft> fft_;
  std::vector<double> power_, mel_;
};

// Streaming front end (Kaldi's OnlineFbank): feed chunks, read frames as they become ready.
class OnlineFbank {
 public:
  explicit OnlineFbank(const FbankOptions& opts);

  // Appends samples (int16 scale). samp_freq must equal opts.frame_opts.samp_freq (no resampling).
  // Throws after InputFinished().
  void AcceptWaveform(float samp_freq, std::span<const float> samples);
  // No more input: with snip_edges = false the final frames (mirrored at the end) become ready.
  void InputFinished();

  // Starts a new waveform with the same options, keeping the mel banks, window and FFT plan: afterwards
  // the object behaves exactly like a newly constructed one (the dither generator restarts from
  // dither_seed).
  void Reset();

  std::int32_t Dim() const { return computer_.Dim(); }
  std::int64_t NumFramesReady() const { return num_frames_; }
  bool IsLastFrame(std::int64_t frame) const { return finished_ && frame == num_frames_ - 1; }
  std::span<const float> GetFrame(std::int64_t frame) const;
  const FbankOptions& GetOptions() const { return opts_; }
  // All frames ready so far as a [T, Dim()] or [Dim(), T] tensor.
  Tensor Features(FeatureLayout layout = FeatureLayout::kTF) const;

 private:
  friend class FbankExtractor;
  void ComputeFeatures();
  // Frames [first, last) of the waveform whose samples from stream position `offset` on are `wave`, in
  // frame order (the dither generator advances frame by frame), each written to out + (f − first)·Dim().
  void ComputeFrames(std::span<const float> wave, std::int64_t offset, std::int64_t first, std::int64_t last,
                     float* out);

  FbankOptions opts_;
  FbankComputer computer_;
  FeatureWindowFunction window_function_;
  DitherState dither_;
  std::vector<float> remainder_;  // samples from waveform_offset_ on
  std::int64_t waveform_offset_ = 0;
  std::int64_t num_frames_ = 0;
  bool finished_ = false;
  std::vector<float> features_;  // num_frames_ × Dim()
  std::vector<double> window_;   // scratch
};

// Whole waveforms one after another with the same options: the set-up (mel banks, window function, FFT
// plan) is done once, which matters for short clips. Compute() returns exactly what ComputeFbank() does.
// Not thread-safe: one per thread.
class FbankExtractor {
 public:
  explicit FbankExtractor(const FbankOptions& opts) : fbank_(opts) {}
  Tensor Compute(std::span<const float> samples, float samp_freq, FeatureLayout layout = FeatureLayout::kTF);
  const FbankOptions& GetOptions() const { return opts_; }

 private:
  OnlineFbank fbank_;
  FbankOptions opts_ = fbank_.GetOptions();
};

// The features of a whole waveform (int16 scale, rate samp_freq). Throws normlab::Error when samp_freq
// differs from opts.frame_opts.samp_freq ("sample frequency mismatch", as Kaldi) and when the waveform
// yields no frame (e.g. shorter than one frame with snip_edges = true: Kaldi warns and outputs 0 frames;
// normlab refuses, because an empty feature matrix silently breaks every later step).
Tensor ComputeFbank(const FbankOptions& opts, std::span<const float> samples, float samp_freq,
                    FeatureLayout layout = FeatureLayout::kTF);

}  // namespace normlab::speech
