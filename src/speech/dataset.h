// speech/dataset.h — the spoken-digit data set (recipe: /work/shared speech.md, "Spoken-digit data recipe").
//
// Clips: espeak-ng -v VOICE -s SPEED -p PITCH -z --stdout WORD | sox -R -q -t wav - -r 16000 -c 1 -b 16 OUT
// (sox -R: repeatable), words "zero".."nine". Speaker-disjoint splits by accent and voice variant:
//   train      = {en-us, en-gb, en-gb-x-rp, en-gb-scotland, en-029} × {m1..m5, f1..f3}   (40 voices)
//   validation = the train accents × {m6, f4}                                          (10 voices)
//   test       = {en-gb-x-gbclan, en-gb-x-gbcwmd, en-us-nyc} × {m6, m7, f4, f5}        (12 voices)
// espeak-ng 1.51 ignores the variant in "en-gb+VAR", so en-gb voices are spoken as "en+VAR" (the same
// British voice, variant applied). Every voice is checked to sound different: a probe phrase ("zero one
// ... nine" at speed 170, pitch 50) is synthesized per voice and hashed; equal hashes are an error. (Known
// overlap, not an error: en-us-nyc+X says 7 of the 10 digits exactly like en-us+X.)
// `renditions` clips per voice and digit with speed U{130..210} and pitch U{25..75}, drawn in a fixed order
// (split, voice, digit, rendition) from std::mt19937_64(seed) before any work starts, so the output does not
// depend on the thread count or scheduling: same seed → same bytes.
//
// Test corruptions, float WAV in [−1, 1]-scale units via libsndfile (no clipping), one copy per kind of
// every test clip:
//   gain+20dB, gain-20dB, gain+40dB, gain-40dB   constant gain
//   segment-gain   ±U(20, 30) dB per segment of U(50, 100) ms
//   channel        a fixed random channel per utterance: highpass U(100, 600) Hz, lowpass U(2.5, 5) kHz,
//                  peaking EQ at U(0.5, 3) kHz with U(−10, 10) dB (RBJ biquads, corrupt.h)
// Random corruption parameters come from a generator seeded by (seed, clip index), also fixed in advance.
//
// Layout under out_dir:
//   {train,validation,test}/VOICE_DIGIT_K.wav   16-bit PCM clips (VOICE like "en-gb-x-rp+m1")
//   test-corrupt/KIND/VOICE_DIGIT_K.wav         float copies
//   manifest.csv   file,split,digit,voice,speed,pitch,corruption,params  (paths relative to out_dir;
//                  corruption "clean" for the clips themselves)
//   voices.csv     voice,split,espeak_voice,probe_md5-like hash
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace normlab::speech {

struct DigitVoice {
  std::string name;          // "en-gb+m1": accent + variant, used in file names and the manifest
  std::string espeak_voice;  // "en+m1": what espeak-ng -v gets
  std::string split;         // "train", "validation" or "test"
};

// The 62 voices of the recipe, in order: train, validation, test; within a split accent-major.
std::vector<DigitVoice> DigitVoices();

extern const char* const kDigitWords[10];
extern const char* const kCorruptions[6];

struct SpeechDataOptions {
  std::string out_dir;
  std::uint64_t seed = 0;
  int renditions = 5;   // clips per voice and digit
  int limit = 0;        // > 0: only the first `limit` digits and the first `limit` voices of each split
  int jobs = 0;         // worker threads (espeak-ng/sox processes in flight); 0 = all cores
  bool corrupt = true;  // write test-corrupt/
  std::string espeak = "espeak-ng", sox = "sox";  // programs (found on PATH)
  // Called from worker threads (serialized) after each finished task: (done, total).
  std::function<void(std::size_t, std::size_t)> progress;
};

struct SpeechDataSummary {
  std::size_t clips = 0, corrupted = 0, voices = 0;
  double seconds_of_audio = 0;
};

// Builds the data set. Throws normlab::Error when espeak-ng or sox is missing or fails (with its
// message), when two voices sound identical, or when out_dir cannot be written.
SpeechDataSummary MakeSpeechData(const SpeechDataOptions& opts);

}  // namespace normlab::speech
