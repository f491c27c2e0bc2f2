// src/io/npy.cpp — NumPy .npy reader and writer (see include/normlab/npy.h for the contract).
//
// Layout of a .npy file: "\x93NUMPY", major and minor version bytes, the header length (uint16 for 1.0,
// uint32 for 2.0/3.0, little-endian), a Python dict literal such as
// "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" padded with spaces and ended by '\n',
// then the raw elements. The header is parsed by a small Python-literal parser (strings, integers,
// True/False/None, tuples, lists), never evaluated. Every size computation is overflow-checked before
// anything is allocated or indexed, so arbitrary bytes either parse or throw normlab::Error.
#include <normlab/npy.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace normlab {
namespace {

static_assert(std::endian::native == std::endian::little, "normlab's .npy I/O assumes a little-endian host");

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr const char* kSupported = "normlab reads little-endian float32/float64/int32/int64";
constexpr int kMaxNesting = 32;

constexpr std::array<const char*, 4> kDTypeNames = {"float32", "float64", "int32", "int64"};

std::size_t itemsize(NpyDType t) {
  return t == NpyDType::f32 || t == NpyDType::i32 ? 4 : 8;
}
const char* dtype_name(NpyDType t) {
  return kDTypeNames[static_cast<std::size_t>(t)];
}
std::string errno_text(int err) {
  return std::generic_category().message(err);
}

// A printable, bounded excerpt of untrusted text for error messages.
std::string excerpt(std::string_view s, std::size_t max = 120) {
  std::string out;
  for (char c : s.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    out += c == '\n' ? "\\n" : u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  if (s.size() > max) out += "...";
  return out;
}

// Number of elements of `shape`, checking that the product of its non-zero dims times `item` bytes fits
// in an int64 (so no later stride or size computation can overflow, even for zero-size arrays).
Index checked_numel(const Dims& shape, std::size_t item, const std::string& what) {
  constexpr Index kMax = std::numeric_limits<Index>::max();
  Index bytes = static_cast<Index>(item);
  bool zero = false;
  for (int i = 0; i < shape.size(); ++i) {
    NL_CHECK(shape[i] >= 0, "{}: negative dimension {} on axis {} of shape {}", what, shape[i], i,
             shape.str());
    if (shape[i] == 0) {
      zero = true;
      continue;
    }
    NL_CHECK(bytes <= kMax / shape[i], "{}: shape {} is too large: its size in bytes overflows int64", what,
             shape.str());
    bytes *= shape[i];
  }
  return zero ? 0 : bytes / static_cast<Index>(item);
}

// ---- header dict parsing ---------------------------------------------------------------------------

struct PyValue {
  enum class Kind { kStr, kInt, kBool, kNone, kTuple, kList };
  Kind kind = Kind::kNone;
  std::string str;
  Index integer = 0;
  bool boolean = false;
  std::vector<PyValue> items;
  std::string_view src;  // the literal's text, for error messages
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  // "{key: value, ...}" with string keys, optionally followed by whitespace only.
  std::vector<std::pair<std::string, PyValue>> parse_dict() {
    std::vector<std::pair<std::string, PyValue>> out;
    skip_ws();
    if (peek() != '{') fail("expected '{'");
    ++pos_;
    skip_ws();
    while (peek() != '}') {
      PyValue key = parse_value(0);
      if (key.kind != PyValue::Kind::kStr) fail(fmt::format("dict key {} is not a string", excerpt(key.src)));
      for (const auto& kv : out)
        if (kv.first == key.str) fail(fmt::format("duplicate key '{}'", excerpt(key.str)));
      skip_ws();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      out.emplace_back(key.str, parse_value(0));
      after_item('}');
    }
    ++pos_;
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the closing '}'");
    return out;
  }

 private:
  int peek() const { return pos_ < s_.size() ? static_cast<unsigned char>(s_[pos_]) : -1; }
  void skip_ws() {
    while (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r') ++pos_;
  }
  static bool is_digit(int c) { return c >= '0' && c <= '9'; }
  static bool is_name(int c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || is_digit(c);
  }
  // After a dict entry or sequence item: consumes a ',' (returns true) or checks that `close` follows.
  bool after_item(int close) {
    skip_ws();
    if (peek() != ',' && peek() != close) fail(fmt::format("expected ',' or '{}'", static_cast<char>(close)));
    if (peek() == close) return false;
    ++pos_;
    skip_ws();
    return true;
  }
  [[noreturn]] void fail(const std::string& problem) const {
    throw Error(fmt::format("{}: malformed .npy header: {} at offset {} in \"{}\"", what_, problem, pos_,
                            excerpt(s_)));
  }

  PyValue parse_value(int depth) {
    skip_ws();
    if (depth > kMaxNesting) fail("literals nested too deeply");
    const std::size_t start = pos_;
    const int c = peek();
    PyValue v;
    if (c == '\'' || c == '"') {
      v.kind = PyValue::Kind::kStr;
      ++pos_;
      for (;;) {
        int d = peek();
        if (d == -1 || d == '\n') fail("unterminated string");
        ++pos_;
        if (d == c) break;
        if (d == '\\') {
          if (peek() == -1) fail("unterminated string");
          d = peek();
          ++pos_;
        }
        v.str += static_cast<char>(d);
      }
    } else if (c == '(' || c == '[') {
      const int close = c == '(' ? ')' : ']';
      bool trailing_comma = false;
      ++pos_;
      skip_ws();
      while (peek() != close) {
        v.items.push_back(parse_value(depth + 1));
        trailing_comma = after_item(close);
      }
      ++pos_;
      // "(x)" is just x in Python; "(x,)" and "()" are tuples.
      if (c == '(' && v.items.size() == 1 && !trailing_comma) {
        PyValue inner = std::move(v.items[0]);
        inner.src = s_.substr(start, pos_ - start);
        return inner;
      }
      v.kind = c == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
    } else if (c == '-' || c == '+' || is_digit(c)) {
      v.kind = PyValue::Kind::kInt;
      const bool negative = c == '-';
      if (c == '-' || c == '+') ++pos_;
      if (!is_digit(peek())) fail("expected a digit");
      while (is_digit(peek())) {
        const int digit = peek() - '0';
        if (v.integer > (std::numeric_limits<Index>::max() - digit) / 10)
          fail(fmt::format("integer {}... is out of the int64 range",
                           excerpt(s_.substr(start, pos_ - start))));
        v.integer = v.integer * 10 + digit;
        ++pos_;
      }
      if (peek() == 'L' || peek() == 'l') ++pos_;  // Python 2 long suffix, as in old NumPy files
      if (negative) v.integer = -v.integer;
    } else if (is_name(c) && !is_digit(c)) {
      while (is_name(peek())) ++pos_;
      const std::string_view name = s_.substr(start, pos_ - start);
      if (name == "True" || name == "False") {
        v.kind = PyValue::Kind::kBool;
        v.boolean = name == "True";
      } else if (name != "None") {
        fail(fmt::format("unknown name '{}'", excerpt(name)));
      }
    } else {
      fail(c == -1 ? std::string("unexpected end of header")
                   : fmt::format("unexpected character '{}'", excerpt(s_.substr(pos_, 1))));
    }
    v.src = s_.substr(start, pos_ - start);
    return v;
  }

  std::string_view s_;
  const std::string& what_;
  std::size_t pos_ = 0;
};

NpyDType parse_descr(const PyValue& descr, const std::string& what) {
  NL_CHECK(descr.kind != PyValue::Kind::kList && descr.kind != PyValue::Kind::kTuple,
           "{}: unsupported dtype {} (structured dtypes are not supported; {})", what, excerpt(descr.src),
           kSupported);
  NL_CHECK(descr.kind == PyValue::Kind::kStr, "{}: malformed .npy header: 'descr' is {}, not a string", what,
           excerpt(descr.src));
  std::string_view d = descr.str;
  if (d.size() == 3 && (d[0] == '<' || d[0] == '=')) d.remove_prefix(1);  // '=' is native: little-endian
  if (d == "f4") return NpyDType::f32;
  if (d == "f8") return NpyDType::f64;
  if (d == "i4") return NpyDType::i32;
  if (d == "i8") return NpyDType::i64;
  throw Error(fmt::format("{}: unsupported dtype '{}' ({})", what, excerpt(descr.str), kSupported));
}

// Calls f(value) for every element, in C order, with the value in its stored type.
template <typename Src, typename F>
void visit_as(const NpyHeader& h, const std::byte* data, F& f) {
  Dims strides = contiguous_strides(h.shape);
  if (h.fortran_order) {
    Index acc = 1;
    for (int i = 0; i < h.shape.size(); ++i) {
      strides[i] = acc;
      acc *= h.shape[i];  // cannot overflow: checked_numel bounded the product of the non-zero dims
    }
  }
  for_each_offset(h.shape, strides, [&](Index off) {
    Src v;
    std::memcpy(&v, data + static_cast<std::size_t>(off) * sizeof(Src), sizeof(Src));
    f(v);
  });
}

template <typename F>
void visit_elements(const NpyHeader& h, std::span<const std::byte> bytes, F&& f) {
  const std::byte* data = bytes.data() + h.data_offset;
  if (h.dtype == NpyDType::f32) return visit_as<float>(h, data, f);
  if (h.dtype == NpyDType::f64) return visit_as<double>(h, data, f);
  if (h.dtype == NpyDType::i32) return visit_as<std::int32_t>(h, data, f);
  visit_as<std::int64_t>(h, data, f);
}

template <typename T>
BasicTensor<T> parse_float(std::span<const std::byte> bytes, const std::string& what) {
  const NpyHeader h = parse_npy_header(bytes, what);
  NL_CHECK(h.dtype == NpyDType::f32 || h.dtype == NpyDType::f64,
           "{}: expected a float32 or float64 array, found {} (integer arrays load with load_npy_index)",
           what, dtype_name(h.dtype));
  BasicTensor<T> t(h.shape);
  T* out = t.data();
  Index i = 0;
  visit_elements(h, bytes, [&](auto v) {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<decltype(v), double>) {
      // Finite values that would round to infinity are refused rather than turned into infinities (the
      // cast would also be undefined); those within half an ulp above FLT_MAX round to FLT_MAX.
      NL_CHECK(!(std::isfinite(v) && std::fabs(v) >= 0x1.ffffffp127),
               "{}: element {} = {} overflows float32 (load it with load_npy_f64)", what, i, v);
      constexpr double kFltMax = std::numeric_limits<float>::max();
      if (std::isfinite(v)) v = std::clamp(v, -kFltMax, kFltMax);
    }
    out[i++] = static_cast<T>(v);
  });
  return t;
}

std::vector<std::byte> read_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  NL_CHECK(f != nullptr, "{}: cannot open file for reading: {}", path, errno_text(errno));
  std::vector<std::byte> buf;
  std::array<std::byte, 1 << 16> chunk;
  for (std::size_t got; (got = std::fread(chunk.data(), 1, chunk.size(), f.get())) > 0;)
    buf.insert(buf.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(got));
  NL_CHECK(!std::ferror(f.get()), "{}: read error: {}", path, errno_text(errno));
  return buf;
}

// ---- writing ---------------------------------------------------------------------------------------

// Writes PATH.tmp and renames it over PATH on commit(); removes PATH.tmp if destroyed before that.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
    f_ = std::fopen(tmp_.c_str(), "wb");
    NL_CHECK(f_ != nullptr, "{}: cannot open '{}' for writing: {}", path_, tmp_, errno_text(errno));
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (f_ != nullptr) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
  }
  void write(const void* p, std::size_t n) {
    NL_CHECK(n == 0 || std::fwrite(p, 1, n, f_) == n, "{}: write error on '{}': {}", path_, tmp_,
             errno_text(errno));
  }
  void commit() {
    const bool flushed = std::fflush(f_) == 0;
    const int err = errno;
    const bool closed = std::fclose(f_) == 0;
    f_ = nullptr;
    NL_CHECK(flushed && closed, "{}: write error on '{}': {}", path_, tmp_,
             errno_text(flushed ? errno : err));
    NL_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, "{}: cannot rename '{}' to '{}': {}", path_, tmp_,
             path_, errno_text(errno));
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

// Magic, version, length and the padded dict, so that the data starts at a multiple of 64 bytes.
std::string make_header(const char* descr, const Dims& shape) {
  std::string dims;
  for (int i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, dims);
  for (int major = 1;; ++major) {
    const std::size_t prefix = kMagic.size() + 2 + (major == 1 ? 2 : 4);
    const std::size_t len = dict.size() + 1 + (64 - (prefix + dict.size() + 1) % 64) % 64;
    if (major == 1 && len > 0xffff) continue;
    std::string out(kMagic);
    out += static_cast<char>(major);
    out += '\0';
    for (std::size_t b = 0; b < prefix - kMagic.size() - 2; ++b)
      out += static_cast<char>((len >> (8 * b)) & 0xff);
    out += dict;
    out.append(len - dict.size() - 1, ' ');
    return out + '\n';
  }
}

template <typename T>
void save_view(const std::string& path, const char* descr, TensorView<const T> v) {
  NL_CHECK(v.defined(), "{}: cannot save an undefined view", path);
  const Index n = checked_numel(v.shape(), sizeof(T), path);
  const std::string header = make_header(descr, v.shape());
  AtomicFile file(path);
  file.write(header.data(), header.size());
  if (n > 0 && v.is_contiguous()) {
    file.write(v.data(), static_cast<std::size_t>(n) * sizeof(T));
  } else {
    std::array<T, 4096> buf;
    std::size_t used = 0;
    for_each_offset(v.shape(), v.strides(), [&](Index off) {
      buf[used++] = v.data()[off];
      if (used == buf.size()) {
        file.write(buf.data(), used * sizeof(T));
        used = 0;
      }
    });
    file.write(buf.data(), used * sizeof(T));
  }
  file.commit();
}

}  // namespace

NpyHeader parse_npy_header(std::span<const std::byte> bytes, const std::string& what) {
  const std::size_t n = bytes.size();
  const auto* chars = reinterpret_cast<const char*>(bytes.data());
  NL_CHECK(n >= kMagic.size(), "{}: file is {} bytes, shorter than the 6-byte .npy magic string", what, n);
  NL_CHECK(std::string_view(chars, kMagic.size()) == kMagic,
           "{}: bad magic: not a .npy file (it starts with \"{}\", expected \"\\x93NUMPY\")", what,
           excerpt(std::string_view(chars, kMagic.size())));
  NL_CHECK(n >= kMagic.size() + 2, "{}: file is {} bytes and ends inside the .npy version", what, n);
  NpyHeader h{};
  h.version_major = std::to_integer<int>(bytes[6]);
  const int minor = std::to_integer<int>(bytes[7]);
  NL_CHECK(h.version_major >= 1 && h.version_major <= 3 && minor == 0,
           "{}: unsupported .npy format version {}.{} (normlab reads 1.0, 2.0 and 3.0)", what,
           h.version_major, minor);
  const int len_bytes = h.version_major == 1 ? 2 : 4;
  const std::size_t prefix = kMagic.size() + 2 + static_cast<std::size_t>(len_bytes);
  NL_CHECK(n >= prefix, "{}: file is {} bytes and ends inside the .npy header length", what, n);
  std::size_t header_len = 0;  // little-endian uint16 or uint32
  for (std::size_t i = prefix; i-- > kMagic.size() + 2;)
    header_len = header_len << 8 | std::to_integer<std::size_t>(bytes[i]);
  NL_CHECK(header_len <= n - prefix, "{}: header length {} runs past the end of the file ({} bytes)", what,
           header_len, n);
  h.data_offset = prefix + header_len;

  const auto dict = HeaderParser(std::string_view(chars + prefix, header_len), what).parse_dict();
  for (const auto& kv : dict)
    NL_CHECK(kv.first == "descr" || kv.first == "fortran_order" || kv.first == "shape",
             "{}: malformed .npy header: unexpected key '{}'", what, excerpt(kv.first));
  auto get = [&](const char* key) {
    for (const auto& kv : dict)
      if (kv.first == key) return &kv.second;
    throw Error(fmt::format("{}: malformed .npy header: missing key '{}' in \"{}\"", what, key,
                            excerpt(std::string_view(chars + prefix, header_len))));
  };
  const PyValue* descr = get("descr");
  const PyValue* fortran = get("fortran_order");
  const PyValue* shape = get("shape");

  h.dtype = parse_descr(*descr, what);
  NL_CHECK(fortran->kind == PyValue::Kind::kBool,
           "{}: malformed .npy header: 'fortran_order' is {}, not True/False", what, excerpt(fortran->src));
  h.fortran_order = fortran->boolean;
  NL_CHECK(shape->kind == PyValue::Kind::kTuple, "{}: malformed .npy header: 'shape' is {}, not a tuple",
           what, excerpt(shape->src));
  NL_CHECK(shape->items.size() <= static_cast<std::size_t>(kMaxRank),
           "{}: rank {} exceeds the maximum rank {} (shape {})", what, shape->items.size(), kMaxRank,
           excerpt(shape->src));
  for (const PyValue& d : shape->items) {
    NL_CHECK(d.kind == PyValue::Kind::kInt, "{}: malformed .npy header: shape entry {} is not an integer",
             what, excerpt(d.src));
    NL_CHECK(d.integer >= 0, "{}: negative dimension {} in shape {}", what, d.integer, excerpt(shape->src));
    h.shape.push_back(d.integer);
  }

  const Index numel = checked_numel(h.shape, itemsize(h.dtype), what);
  const auto expected = static_cast<std::uint64_t>(numel) * itemsize(h.dtype);
  const std::uint64_t actual = n - h.data_offset;
  NL_CHECK(
      actual >= expected,
      "{}: truncated data: shape {} of {} needs {} bytes after the header, but the file has {} bytes there",
      what, h.shape.str(), dtype_name(h.dtype), expected, actual);
  NL_CHECK(actual == expected, "{}: {} extra bytes after the data (shape {} of {} needs {} bytes, found {})",
           what, actual - expected, h.shape.str(), dtype_name(h.dtype), expected, actual);
  return h;
}

Tensor parse_npy(std::span<const std::byte> bytes, const std::string& what) {
  return parse_float<float>(bytes, what);
}

Tensor load_npy(const std::string& path) {
  return parse_float<float>(read_file(path), path);
}

BasicTensor<double> load_npy_f64(const std::string& path) {
  return parse_float<double>(read_file(path), path);
}

std::vector<Index> load_npy_index(const std::string& path) {
  const std::vector<std::byte> bytes = read_file(path);
  const NpyHeader h = parse_npy_header(bytes, path);
  std::vector<Index> out;
  out.reserve(static_cast<std::size_t>(h.shape.product()));
  visit_elements(h, bytes, [&](auto v) {
    if constexpr (std::is_floating_point_v<decltype(v)>) {
      // 2^63 is exactly representable; every float below it in magnitude converts without overflow.
      constexpr double kLimit = 0x1p63;
      const double d = v;
      NL_CHECK(d >= -kLimit && d < kLimit && std::trunc(d) == d,
               "{}: element {} = {} of a {} array is not an integer in the int64 range", path, out.size(), d,
               dtype_name(h.dtype));
      out.push_back(static_cast<Index>(d));
    } else {
      out.push_back(static_cast<Index>(v));
    }
  });
  return out;
}

void save_npy(const std::string& path, TensorView<const float> v) {
  save_view<float>(path, "<f4", v);
}

void save_npy(const std::string& path, TensorView<const double> v) {
  save_view<double>(path, "<f8", v);
}

void save_npy_index(const std::string& path, std::span<const Index> values, Dims shape) {
  const Index n = checked_numel(shape, sizeof(Index), path);
  NL_CHECK(static_cast<std::size_t>(n) == values.size(), "{}: {} values for shape {} ({} elements)", path,
           values.size(), shape.str(), n);
  save_view<Index>(path, "<i8", TensorView<const Index>(values.data(), shape));
}

}  // namespace normlab
