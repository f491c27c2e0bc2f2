// Byte-level language-model data (src/nn/data.h).
#include "nn/data.h"

#include <normlab/error.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace normlab::nn {

namespace fs = std::filesystem;

namespace {

std::string missing_message(const std::string& dir) {
  return "fortunes corpus not found at " + dir +
         "; install the Debian packages fortunes and fortunes-min (scripts/install-deps)";
}

void append_file(std::vector<std::uint8_t>& out, const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  NL_CHECK(in.good(), "cannot open {}", path.string());
  out.insert(out.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  NL_CHECK(!in.bad(), "error reading {}", path.string());
}

}  // namespace

std::vector<std::uint8_t> load_fortunes(const std::string& dir) {
  std::error_code ec;
  NL_CHECK(fs::is_directory(dir, ec), "{}", missing_message(dir));
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;  // *.u8 are links
    const std::string name = e.path().filename().string();
    if (name.ends_with(".dat") || name.ends_with(".u8")) continue;
    names.push_back(name);
  }
  NL_CHECK(!ec, "{} ({})", missing_message(dir), ec.message());
  NL_CHECK(!names.empty(), "{} (the folder has no fortune files)", missing_message(dir));
  std::sort(names.begin(), names.end());  // byte order (the C locale's `ls`)
  std::vector<std::uint8_t> out;
  for (const std::string& n : names) append_file(out, fs::path(dir) / n);
  return out;
}

std::vector<std::uint8_t> load_corpus(const std::string& spec) {
  if (spec == "fortunes") return load_fortunes();
  std::error_code ec;
  NL_CHECK(fs::is_regular_file(spec, ec), "data file not found: {} (give a text file or \"fortunes\")", spec);
  std::vector<std::uint8_t> out;
  append_file(out, spec);
  return out;
}

double unigram_entropy(std::span<const std::uint8_t> bytes) {
  NL_CHECK(!bytes.empty(), "unigram entropy of an empty byte sequence");
  std::array<std::int64_t, 256> counts{};
  for (std::uint8_t b : bytes) ++counts[b];
  const double n = static_cast<double>(bytes.size());
  double h = 0;
  for (std::int64_t c : counts)
    if (c > 0) {
      const double p = static_cast<double>(c) / n;
      h -= p * std::log(p);
    }
  return h;
}

double unigram_cross_entropy(std::span<const std::uint8_t> fit, std::span<const std::uint8_t> eval) {
  NL_CHECK(!eval.empty(), "unigram cross-entropy of an empty byte sequence");
  std::array<double, 256> counts{};
  for (std::uint8_t b : fit) counts[b] += 1;
  const double denom = static_cast<double>(fit.size()) + 0.5 * 256;
  std::array<double, 256> nlp{};
  for (std::size_t i = 0; i < 256; ++i) nlp[i] = -std::log((counts[i] + 0.5) / denom);
  double s = 0;
  for (std::uint8_t b : eval) s += nlp[b];
  return s / static_cast<double>(eval.size());
}

LmData::LmData(std::vector<std::uint8_t> bytes, double val_fraction) : bytes_(std::move(bytes)) {
  NL_CHECK(val_fraction > 0 && val_fraction < 1, "validation fraction must be in (0, 1), got {}", val_fraction);
  const Index n = size();
  const Index val = static_cast<Index>(std::floor(val_fraction * static_cast<double>(n)));
  NL_CHECK(n >= 4 && val >= 2 && n - val >= 2, "corpus too small: {} bytes", n);
  train_size_ = n - val;
}

LmData LmData::load(const std::string& spec, double val_fraction) { return LmData(load_corpus(spec), val_fraction); }

std::vector<Index> LmData::validation_offsets(Index T, Index count) const {
  NL_CHECK(T >= 1, "sequence length must be ≥ 1, got {}", T);
  NL_CHECK(count >= 1, "validation window count must be ≥ 1, got {}", count);
  const Index last = val_size() - (T + 1);
  NL_CHECK(last >= 0, "validation split ({} bytes) is shorter than one window of {} bytes", val_size(), T + 1);
  std::vector<Index> out(static_cast<std::size_t>(count));
  for (Index i = 0; i < count; ++i)
    out[static_cast<std::size_t>(i)] = count == 1 ? 0 : i * last / (count - 1);
  return out;
}

void LmData::validation_batch(std::int32_t* tokens, std::int32_t* targets, std::span<const Index> offsets,
                              Index T) const {
  const std::span<const std::uint8_t> v = val();
  for (std::size_t b = 0; b < offsets.size(); ++b) {
    const Index o = offsets[b];
    NL_CHECK(o >= 0 && o + T + 1 <= val_size(), "validation window at {} (+{}) outside the split of {} bytes", o,
             T + 1, val_size());
    for (Index t = 0; t < T; ++t) {
      tokens[static_cast<Index>(b) * T + t] = v[static_cast<std::size_t>(o + t)];
      targets[static_cast<Index>(b) * T + t] = v[static_cast<std::size_t>(o + t + 1)];
    }
  }
}

BatchSampler::BatchSampler(const LmData& data, std::uint64_t seed) : data_(&data), rng_(seed) {}

void BatchSampler::sample(std::int32_t* tokens, std::int32_t* targets, Index B, Index T) {
  NL_CHECK(B >= 1 && T >= 1, "batch and sequence length must be ≥ 1, got B={}, T={}", B, T);
  const Index range = data_->train_size() - T;  // offsets 0 .. train_size − T − 1
  NL_CHECK(range >= 1, "training split ({} bytes) is shorter than one window of {} bytes", data_->train_size(),
           T + 1);
  const std::span<const std::uint8_t> tr = data_->train();
  for (Index b = 0; b < B; ++b) {
    const Index o = static_cast<Index>(rng_() % static_cast<std::uint64_t>(range));
    for (Index t = 0; t < T; ++t) {
      tokens[b * T + t] = tr[static_cast<std::size_t>(o + t)];
      targets[b * T + t] = tr[static_cast<std::size_t>(o + t + 1)];
    }
  }
}

std::string BatchSampler::rng_state() const {
  std::ostringstream os;
  os << rng_;
  return os.str();
}

void BatchSampler::set_rng_state(const std::string& state) {
  std::istringstream is(state);
  std::mt19937_64 r;
  is >> r;
  NL_CHECK(!is.fail(), "malformed random-generator state ({} characters)", state.size());
  rng_ = r;
}

}  // namespace normlab::nn
