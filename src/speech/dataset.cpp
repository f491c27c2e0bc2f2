// The spoken-digit data set; the contract is in src/speech/dataset.h.
#include "speech/dataset.h"

#include <normlab/error.h>
#include <normlab/speech/wav.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "speech/corrupt.h"

namespace normlab::speech {

const char* const kDigitWords[10] = {"zero", "one", "two",   "three", "four",
                                     "five", "six", "seven", "eight", "nine"};
const char* const kCorruptions[6] = {"gain+20dB", "gain-20dB",    "gain+40dB",
                                     "gain-40dB", "segment-gain", "channel"};

std::vector<DigitVoice> DigitVoices() {
  const std::vector<std::string> train_accents = {"en-us", "en-gb", "en-gb-x-rp", "en-gb-scotland", "en-029"};
  const std::vector<std::string> test_accents = {"en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-us-nyc"};
  std::vector<DigitVoice> v;
  auto add = [&](const std::string& accent, const std::string& variant, const char* split) {
    // espeak-ng 1.51 ignores the variant of "en-gb+VAR"; "en+VAR" is the same voice with the variant.
    const std::string espeak = (accent == "en-gb" ? std::string("en") : accent) + "+" + variant;
    v.push_back({accent + "+" + variant, espeak, split});
  };
  for (const auto& a : train_accents)
    for (const char* var : {"m1", "m2", "m3", "m4", "m5", "f1", "f2", "f3"}) add(a, var, "train");
  for (const auto& a : train_accents)
    for (const char* var : {"m6", "f4"}) add(a, var, "validation");
  for (const auto& a : test_accents)
    for (const char* var : {"m6", "m7", "f4", "f5"}) add(a, var, "test");
  return v;
}

namespace {

namespace fs = std::filesystem;
constexpr int kRate = 16000;

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd` through /bin/sh with stderr folded into the captured output; throws with the output on failure.
void run_shell(const std::string& cmd, const std::string& what) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  NL_CHECK(p != nullptr, "{}: cannot start /bin/sh", what);
  std::string out;
  char buf[512];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  NL_CHECK(status == 0, "{} failed (status {}): {}\n  command: {}", what, status,
           out.empty() ? "(no output)" : out, cmd);
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a(const std::vector<float>& x) {
  std::uint64_t h = 1469598103934665603ull;
  for (float f : x) {
    unsigned char b[sizeof f];
    std::memcpy(b, &f, sizeof f);
    for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

struct Clip {
  std::size_t voice;  // index into DigitVoices()
  int digit, rendition, speed, pitch;
  std::string file;  // relative to out_dir
  std::uint64_t corrupt_seed;
};

struct CorruptedRow {
  std::string file, kind, params;
};

// espeak-ng | sox into `out` (via a temporary name so that no half-written clip is ever left under its name).
void synthesize(const SpeechDataOptions& o, const std::string& espeak_voice, int speed, int pitch,
                const std::string& text, const fs::path& out) {
  const fs::path tmp = out.string() + ".part.wav";
  run_shell(o.espeak + " -v " + quote(espeak_voice) + " -s " + std::to_string(speed) + " -p " +
                std::to_string(pitch) + " -z --stdout " + quote(text) + " | " + o.sox +
                " -R -q -t wav - -r " + std::to_string(kRate) + " -c 1 -b 16 " + quote(tmp.string()),
            "espeak-ng | sox for voice " + espeak_voice + ", \"" + text + "\"");
  std::error_code ec;
  fs::rename(tmp, out, ec);
  NL_CHECK(!ec, "cannot rename {} to {}: {}", tmp.string(), out.string(), ec.message());
}

std::vector<CorruptedRow> corrupt_clip(const fs::path& root, const Clip& c, const std::string& stem) {
  const Waveform w = read_wav((root / c.file).string(), {.expected_samp_freq = kRate, .normalize = true});
  std::mt19937_64 rng(c.corrupt_seed);
  std::vector<CorruptedRow> rows;
  const WavWriteOptions wo{.format = WavSampleFormat::kFloat32, .from_int16_scale = false};
  for (const char* kind : kCorruptions) {
    std::vector<float> x = w.samples;
    std::string params;
    const std::string k = kind;
    if (k.rfind("gain", 0) == 0) {
      const double db = std::stod(k.substr(4));  // "+20dB" → 20
      ApplyGainDb(x, db);
      params = fmt::format("gain_db={:+g}", db);
    } else if (k == "segment-gain") {
      const std::vector<double> g = ApplySegmentGain(x, kRate, rng);
      params = "segment_db=";
      for (std::size_t i = 0; i < g.size(); ++i) params += fmt::format("{}{:+.2f}", i ? "/" : "", g[i]);
    } else {
      const ChannelFilter f = ChannelFilter::Random(rng);
      f.Apply(x, kRate);
      params = f.ToString();
    }
    const std::string rel = "test-corrupt/" + k + "/" + stem;
    write_wav((root / rel).string(), x, kRate, wo);
    rows.push_back({rel, k, params});
  }
  return rows;
}

// Runs task(i) for i in [0, n) on `jobs` threads; the first failure stops the rest and is rethrown.
template <typename F>
void parallel_tasks(std::size_t n, std::size_t jobs, const SpeechDataOptions& o, std::size_t& done,
                    std::size_t total, std::mutex& mu, F&& task) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::string error;
  auto worker = [&] {
    for (std::size_t i; !failed && (i = next.fetch_add(1)) < n;) {
      try {
        task(i);
        std::lock_guard<std::mutex> lock(mu);
        ++done;
        if (o.progress) o.progress(done, total);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed.exchange(true)) error = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t j = 1; j < std::min(jobs, n); ++j) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  NL_CHECK(!failed, "{}", error);
}

}  // namespace

SpeechDataSummary MakeSpeechData(const SpeechDataOptions& o) {
  NL_CHECK(!o.out_dir.empty(), "speech-data: --out DIR is required");
  NL_CHECK(o.renditions >= 1, "speech-data: renditions must be ≥ 1, got {}", o.renditions);
  NL_CHECK(o.limit >= 0, "speech-data: --limit must be ≥ 0 (0 = everything), got {}", o.limit);
  NL_CHECK(o.jobs >= 0, "speech-data: --jobs must be ≥ 1 (0 = all cores), got {}", o.jobs);
  run_shell(o.espeak + " --version",
            "espeak-ng (install it: apt-get install espeak-ng sox, or scripts/install-deps)");
  run_shell(o.sox + " --version", "sox (install it: apt-get install espeak-ng sox, or scripts/install-deps)");

  const std::vector<DigitVoice> all = DigitVoices();
  // Draw every clip's speed, pitch and corruption seed for the FULL set first, in a fixed order, so that
  // a --limit subset has exactly the parameters it has in the full set.
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int> speed(130, 210), pitch(25, 75);
  std::vector<Clip> clips;
  std::map<std::string, int> rank_in_split;
  std::vector<bool> voice_used(all.size());
  for (std::size_t v = 0; v < all.size(); ++v) {
    const int rank = rank_in_split[all[v].split]++;
    voice_used[v] = o.limit == 0 || rank < o.limit;
    for (int d = 0; d < 10; ++d)
      for (int k = 0; k < o.renditions; ++k) {
        Clip c{v, d, k, speed(rng), pitch(rng), "", 0};
        c.corrupt_seed = splitmix64(o.seed ^ splitmix64(clips.size() + 1));
        c.file =
            all[v].split + "/" + all[v].name + "_" + std::to_string(d) + "_" + std::to_string(k) + ".wav";
        if (voice_used[v] && (o.limit == 0 || d < o.limit))
          clips.push_back(c);
        else
          clips.push_back(Clip{});  // placeholder keeps the seeds independent of --limit
      }
  }
  std::erase_if(clips, [](const Clip& c) { return c.file.empty(); });
  std::vector<std::size_t> voices;
  for (std::size_t v = 0; v < all.size(); ++v)
    if (voice_used[v]) voices.push_back(v);

  const fs::path root(o.out_dir);
  std::error_code ec;
  for (const char* d : {"train", "validation", "test", ".probe"}) fs::create_directories(root / d, ec);
  if (o.corrupt)
    for (const char* k : kCorruptions) fs::create_directories(root / "test-corrupt" / k, ec);
  NL_CHECK(!ec, "speech-data: cannot create directories under {}: {}", o.out_dir, ec.message());

  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t jobs = o.jobs > 0 ? static_cast<std::size_t>(o.jobs) : hw;
  const std::size_t total = voices.size() + clips.size();
  std::size_t done = 0;
  std::mutex mu;

  // 1. One probe phrase per voice: every voice must sound different.
  std::vector<std::uint64_t> probe_hash(voices.size());
  std::string probe_text;
  for (int d = 0; d < 10; ++d) probe_text += std::string(d ? " " : "") + kDigitWords[d];
  parallel_tasks(voices.size(), jobs, o, done, total, mu, [&](std::size_t i) {
    const DigitVoice& v = all[voices[i]];
    const fs::path p = root / ".probe" / (v.name + ".wav");
    synthesize(o, v.espeak_voice, 170, 50, probe_text, p);
    probe_hash[i] = fnv1a(read_wav(p.string()).samples);
    fs::remove(p);
  });
  fs::remove_all(root / ".probe", ec);
  std::map<std::uint64_t, std::string> by_hash;
  for (std::size_t i = 0; i < voices.size(); ++i) {
    const auto [it, fresh] = by_hash.emplace(probe_hash[i], all[voices[i]].name);
    NL_CHECK(fresh, "speech-data: voices {} and {} produce identical audio (espeak-ng ignored a variant?)",
             it->second, all[voices[i]].name);
  }

  // 2. The clips, and the corrupted copies of the test clips.
  std::vector<double> seconds(clips.size());
  std::vector<std::vector<CorruptedRow>> corrupted(clips.size());
  parallel_tasks(clips.size(), jobs, o, done, total, mu, [&](std::size_t i) {
    const Clip& c = clips[i];
    const DigitVoice& v = all[c.voice];
    synthesize(o, v.espeak_voice, c.speed, c.pitch, kDigitWords[c.digit], root / c.file);
    if (o.corrupt && v.split == "test")
      corrupted[i] = corrupt_clip(root, c, fs::path(c.file).filename().string());
    seconds[i] = static_cast<double>(read_wav((root / c.file).string()).samples.size()) / kRate;
  });

  // 3. manifest.csv and voices.csv (written last, atomically: their presence means the set is complete).
  SpeechDataSummary s;
  s.voices = voices.size();
  std::string manifest = "file,split,digit,voice,speed,pitch,corruption,params\n";
  for (std::size_t i = 0; i < clips.size(); ++i) {
    const Clip& c = clips[i];
    const DigitVoice& v = all[c.voice];
    const std::string common = fmt::format("{},{},{},{},{}", v.split, c.digit, v.name, c.speed, c.pitch);
    manifest += fmt::format("{},{},clean,\n", c.file, common);
    for (const CorruptedRow& r : corrupted[i])
      manifest += fmt::format("{},{},{},{}\n", r.file, common, r.kind, r.params);
    ++s.clips;
    s.corrupted += corrupted[i].size();
    s.seconds_of_audio += seconds[i];
  }
  std::string voices_csv = "voice,split,espeak_voice,probe_hash\n";
  for (std::size_t i = 0; i < voices.size(); ++i) {
    const DigitVoice& v = all[voices[i]];
    voices_csv += fmt::format("{},{},{},{:016x}\n", v.name, v.split, v.espeak_voice, probe_hash[i]);
  }
  for (const auto& [name, text] :
       {std::pair{"voices.csv", &voices_csv}, std::pair{"manifest.csv", &manifest}}) {
    const fs::path p = root / name, tmp = root / (std::string(name) + ".tmp");
    {
      std::ofstream f(tmp, std::ios::binary);
      f << *text;
      NL_CHECK(f.good(), "speech-data: cannot write {}", tmp.string());
    }
    fs::rename(tmp, p, ec);
    NL_CHECK(!ec, "speech-data: cannot rename {} to {}: {}", tmp.string(), p.string(), ec.message());
  }
  return s;
}

}  // namespace normlab::speech
