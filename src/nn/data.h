// Byte-level language-model data (lab.md): a text file, or "fortunes", the lab's default corpus.
//
// "fortunes": every regular file of Debian's fortunes folder (packages fortunes + fortunes-min) that is
// not a *.dat index and not a *.u8 link, concatenated in sorted name order (≈ 2.58 MB). The last 10 %
// of the bytes is the validation split, the rest the training split.
//   Training windows: B windows of T+1 bytes at offsets drawn from a seeded std::mt19937_64
//     (offset = rng() mod (train_size − T)), tokens = bytes [0, T), targets = bytes [1, T+1).
//   Validation windows: a fixed list of windows of T+1 bytes at evenly spaced offsets over the whole
//     validation split (the first at its start, the last at its end), the same for every run with the
//     same T and window count.
#pragma once

#include <normlab/tensor.h>

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace normlab::nn {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The fortunes corpus from `dir`. Throws normlab::Error ("fortunes corpus not found at DIR; install the
// Debian packages fortunes and fortunes-min (scripts/install-deps)") when the folder or its files are
// missing.
std::vector<std::uint8_t> load_fortunes(const std::string& dir = kFortunesDir);
// `spec` is "fortunes" (the corpus above) or the path of any file, read as bytes.
std::vector<std::uint8_t> load_corpus(const std::string& spec);

// Entropy of the byte distribution of `bytes`, in nats: −Σ p log p (the training loss of a model that
// learned only byte frequencies). On fortunes: 3.315 for the training split, 3.355 for the validation
// split (lab.md's "≈ 3.36 stuck level").
double unigram_entropy(std::span<const std::uint8_t> bytes);
// Cross-entropy of `eval` under the byte frequencies of `fit` with add-½ smoothing, in nats: the
// validation loss of a frequency-only model (fortunes: 3.376 for validation under training frequencies).
double unigram_cross_entropy(std::span<const std::uint8_t> fit, std::span<const std::uint8_t> eval);

class LmData {
 public:
  // Splits `bytes`: the last ⌊val_fraction · size⌋ bytes are the validation split.
  explicit LmData(std::vector<std::uint8_t> bytes, double val_fraction = 0.1);
  static LmData load(const std::string& spec, double val_fraction = 0.1);  // load_corpus + split

  Index size() const { return static_cast<Index>(bytes_.size()); }
  Index train_size() const { return train_size_; }
  Index val_size() const { return size() - train_size_; }
  std::span<const std::uint8_t> train() const { return {bytes_.data(), static_cast<std::size_t>(train_size_)}; }
  std::span<const std::uint8_t> val() const {
    return {bytes_.data() + train_size_, static_cast<std::size_t>(val_size())};
  }

  // Offsets (into val()) of `count` evenly spaced validation windows of T+1 bytes:
  // offset_i = ⌊i · (val_size − T − 1) / (count − 1)⌋ (a single window starts at 0).
  std::vector<Index> validation_offsets(Index T, Index count) const;
  // Writes the windows offsets[first, first+B) as (B,T) tokens and targets.
  void validation_batch(std::int32_t* tokens, std::int32_t* targets, std::span<const Index> offsets,
                        Index T) const;

 private:
  std::vector<std::uint8_t> bytes_;
  Index train_size_ = 0;
};

// Seeded random training windows.
class BatchSampler {
 public:
  BatchSampler(const LmData& data, std::uint64_t seed);
  // Draws B windows: tokens and targets are (B,T) int32.
  void sample(std::int32_t* tokens, std::int32_t* targets, Index B, Index T);
  // The generator's state as text (operator<< of std::mt19937_64), for checkpoints, and back.
  std::string rng_state() const;
  void set_rng_state(const std::string& state);  // throws normlab::Error for malformed text

 private:
  const LmData* data_;
  std::mt19937_64 rng_;
};

}  // namespace normlab::nn
