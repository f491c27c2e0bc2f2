// tests/io/npy_test.cpp — the .npy reader and writer (include/normlab/npy.h).
//
// Covers: round trips for float32/float64/int64 at ranks 0..5 from contiguous, permuted, reversed,
// stepped and broadcast views; hand-built version 2.0/3.0 and Fortran-order files; header syntax the
// reader must tolerate; one test per error the reader and writers report (message checked); files written
// by real NumPy (tests/fixtures/npy, made by tests/fixtures/make_npy_fixtures.py); truncation and byte-flip
// fuzzing that must only ever produce normlab::Error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <normlab/npy.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#ifndef NORMLAB_FIXTURES_DIR
#error "NORMLAB_FIXTURES_DIR must be defined (tests/CMakeLists.txt sets it to <source>/tests/fixtures)"
#endif

namespace normlab {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// ---- helpers -------------------------------------------------------------------------------------

// Matches a callable that throws normlab::Error whose message contains every one of `parts`.
auto ThrowsError(std::vector<std::string> parts) {
  std::vector<::testing::Matcher<std::string>> ms;
  for (auto& p : parts) ms.push_back(::testing::HasSubstr(p));
  return ::testing::ThrowsMessage<Error>(::testing::AllOfArray(ms));
}

std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

template <typename T>
std::string Raw(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// A .npy file built by hand: magic, version major.minor, little-endian header length, `dict` + '\n'.
std::string MakeNpy(const std::string& dict, const std::string& data, int major = 1, int minor = 0) {
  const std::string header = dict + "\n";
  std::string s = "\x93NUMPY";
  s += static_cast<char>(major);
  s += static_cast<char>(minor);
  const int len_bytes = major == 1 ? 2 : 4;
  for (int b = 0; b < len_bytes; ++b) s += static_cast<char>((header.size() >> (8 * b)) & 0xff);
  return s + header + data;
}

std::string Dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

std::vector<float> Iota(Index n, float start = 0.0f, float step = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = start + step * static_cast<float>(i);
  return v;
}

template <typename T>
std::vector<T> Elements(const BasicTensor<T>& t) {
  return std::vector<T>(t.data(), t.data() + t.numel());
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string Fixture(const std::string& name) {
  return std::string(NORMLAB_FIXTURES_DIR) + "/npy/" + name;
}

// Each test gets a fresh temporary directory.
class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("normlab_npy_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string Write(const std::string& name, const std::string& contents) const {
    std::ofstream f(Path(name), std::ios::binary);
    f << contents;
    return Path(name);
  }
  fs::path dir_;
};

const std::vector<Dims> kShapesByRank = {{}, {5}, {2, 3}, {3, 1, 4}, {2, 3, 1, 2}, {1, 2, 3, 2, 2}};

// ---- round trips ---------------------------------------------------------------------------------

TEST_F(NpyTest, RoundTripFloat32Ranks0To5) {
  for (const Dims& shape : kShapesByRank) {
    SCOPED_TRACE(shape.str());
    Tensor t(shape);
    for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(i) * 0.75f - 3.0f;
    const std::string p = Path("f32.npy");
    save_npy(p, t.cview());
    const NpyHeader h = parse_npy_header(Bytes(ReadAll(p)), p);
    EXPECT_EQ(h.dtype, NpyDType::f32);
    EXPECT_FALSE(h.fortran_order);
    EXPECT_EQ(h.shape, shape);
    EXPECT_EQ(h.version_major, 1);
    EXPECT_EQ(h.data_offset % 64, 0u);
    Tensor back = load_npy(p);
    EXPECT_EQ(back.shape(), shape);
    EXPECT_EQ(Elements(back), Elements(t));
  }
}

TEST_F(NpyTest, RoundTripFloat64Ranks0To5) {
  for (const Dims& shape : kShapesByRank) {
    SCOPED_TRACE(shape.str());
    BasicTensor<double> t(shape);
    for (Index i = 0; i < t.numel(); ++i) t[i] = 1.0 / 3.0 * static_cast<double>(i) - 1e-300;
    const std::string p = Path("f64.npy");
    save_npy(p, t.cview());
    EXPECT_EQ(parse_npy_header(Bytes(ReadAll(p)), p).dtype, NpyDType::f64);
    BasicTensor<double> back = load_npy_f64(p);
    EXPECT_EQ(back.shape(), shape);
    EXPECT_EQ(Elements(back), Elements(t));
  }
}

TEST_F(NpyTest, RoundTripIndexRanks0To5) {
  for (const Dims& shape : kShapesByRank) {
    SCOPED_TRACE(shape.str());
    std::vector<Index> v(static_cast<std::size_t>(shape.product()));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = (i % 2 ? -1 : 1) * static_cast<Index>(i) * (Index{1} << 40) + static_cast<Index>(i);
    const std::string p = Path("i64.npy");
    save_npy_index(p, v, shape);
    const NpyHeader h = parse_npy_header(Bytes(ReadAll(p)), p);
    EXPECT_EQ(h.dtype, NpyDType::i64);
    EXPECT_EQ(h.shape, shape);
    EXPECT_EQ(load_npy_index(p), v);
  }
}

TEST_F(NpyTest, RoundTripNonContiguousViews) {
  Tensor base(Dims{4, 5, 6});
  for (Index i = 0; i < base.numel(); ++i) base[i] = static_cast<float>(i);
  const ConstView v = base.cview();
  const std::vector<ConstView> views = {
      v.permute({2, 0, 1}),                            // permuted
      v.transpose(0, 2),                               // transposed
      v.slice(1, 4, -1, -1),                           // reversed axis (negative stride)
      v.slice(2, 5, 0, -2).slice(0, 3, -1, -1),        // reversed + stepped on two axes
      v.slice(1, 1, 5, 2).permute({1, 2, 0}),          // stepped + permuted
      v.select(1, 3),                                  // rank 2 from a middle axis
      v.select(0, 2).select(0, 4).select(0, 5),        // rank 0
      v.slice(0, 0, 0),                                // zero-size
      ConstView(base.data(), Dims{3, 4}, Dims{0, 1}),  // broadcast (stride 0)
  };
  for (std::size_t k = 0; k < views.size(); ++k) {
    SCOPED_TRACE(k);
    const std::string p = Path("view.npy");
    save_npy(p, views[k]);
    Tensor expected = Tensor::copy_of(views[k]);
    Tensor back = load_npy(p);
    EXPECT_EQ(back.shape(), views[k].shape());
    EXPECT_EQ(Elements(back), Elements(expected));
  }
}

TEST_F(NpyTest, RoundTripFloat64NegativeStrideView) {
  BasicTensor<double> base(Dims{3, 4});
  for (Index i = 0; i < base.numel(); ++i) base[i] = static_cast<double>(i) + 0.125;
  const auto v = base.cview().slice(0, 2, -1, -1).slice(1, 3, -1, -2);
  const std::string p = Path("f64view.npy");
  save_npy(p, v);
  BasicTensor<double> back = load_npy_f64(p);
  EXPECT_EQ(back.shape(), (Dims{3, 2}));
  EXPECT_THAT(Elements(back), ElementsAre(11.125, 9.125, 7.125, 5.125, 3.125, 1.125));
}

TEST_F(NpyTest, LargeStridedViewCrossesTheWriteBuffer) {
  Tensor base(Dims{3, 4000});
  for (Index i = 0; i < base.numel(); ++i) base[i] = static_cast<float>(i);
  const ConstView v = base.cview().transpose(0, 1);
  const std::string p = Path("big.npy");
  save_npy(p, v);
  EXPECT_EQ(Elements(load_npy(p)), Elements(Tensor::copy_of(v)));
}

TEST_F(NpyTest, SpecialValuesSurviveBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor t(Dims{6}, {std::numeric_limits<float>::quiet_NaN(), inf, -inf, -0.0f,
                     std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()});
  const std::string p = Path("special.npy");
  save_npy(p, t.cview());
  Tensor back = load_npy(p);
  EXPECT_EQ(std::memcmp(back.data(), t.data(), 6 * sizeof(float)), 0);
}

TEST_F(NpyTest, Float64LoadsAsRoundedFloat32AndFloat32WidensExactly) {
  const std::vector<double> d = {
      0.1,         -1.0 / 3.0, 1e-50, 1e30, std::numeric_limits<double>::infinity(),
      3.4028235e38 /* just above FLT_MAX, within half an ulp */};
  const std::string p = Write("d.npy", MakeNpy(Dict("<f8", "(6,)"), Raw(d)));
  Tensor t = load_npy(p);
  ASSERT_EQ(t.numel(), 6);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t[i], static_cast<float>(d[static_cast<std::size_t>(i)]));
  EXPECT_EQ(t[5], std::numeric_limits<float>::max());

  const std::vector<float> f = {0.1f, -2.5f, 1e-40f};
  const std::string q = Write("f.npy", MakeNpy(Dict("<f4", "(3,)"), Raw(f)));
  EXPECT_THAT(Elements(load_npy_f64(q)), ElementsAre(double{0.1f}, -2.5, double{1e-40f}));
}

TEST_F(NpyTest, Float64BeyondFloat32RangeIsAnError) {
  const std::string p = Write("big.npy", MakeNpy(Dict("<f8", "(2,)"), Raw(std::vector<double>{1.0, -1e300})));
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "element 1", "overflows float32"}));
  EXPECT_THAT(Elements(load_npy_f64(p)), ElementsAre(1.0, -1e300));
  // FLT_MAX + half an ulp is a tie that IEEE rounds to infinity: also refused.
  const std::string q =
      Write("tie.npy", MakeNpy(Dict("<f8", "()"), Raw(std::vector<double>{0x1.ffffffp127})));
  EXPECT_THAT([&] { load_npy(q); }, ThrowsError({q, "element 0", "overflows float32"}));
}

TEST_F(NpyTest, ZeroSizeArraysLoad) {
  for (const std::string shape : {"(0,)", "(2, 0, 3)", "(0, 4294967296)"}) {
    SCOPED_TRACE(shape);
    Tensor t = parse_npy(Bytes(MakeNpy(Dict("<f4", shape), "")));
    EXPECT_EQ(t.numel(), 0);
    const std::string p = Write("z.npy", MakeNpy(Dict("<i8", shape), ""));
    EXPECT_TRUE(load_npy_index(p).empty());
  }
  const std::string p = Path("z2.npy");
  save_npy(p, Tensor(Dims{3, 0}).cview());
  EXPECT_EQ(load_npy(p).shape(), (Dims{3, 0}));
}

// ---- hand-built headers --------------------------------------------------------------------------

TEST(NpyParse, Version2And3Headers) {
  const std::vector<float> data = {1.5f, 2.5f, 3.5f, 4.5f};
  for (int major : {2, 3}) {
    SCOPED_TRACE(major);
    const std::string dict = Dict("<f4", "(2, 2)");
    const auto bytes = Bytes(MakeNpy(dict, Raw(data), major));
    const NpyHeader h = parse_npy_header(bytes);
    EXPECT_EQ(h.version_major, major);
    EXPECT_EQ(h.data_offset, 12 + dict.size() + 1);
    EXPECT_EQ(h.shape, (Dims{2, 2}));
    EXPECT_THAT(Elements(parse_npy(bytes)), ElementsAreArray(data));
  }
}

TEST(NpyParse, FortranOrderRank2) {
  const auto bytes = Bytes(MakeNpy(Dict("<f4", "(2, 3)", true), Raw(Iota(6))));
  EXPECT_TRUE(parse_npy_header(bytes).fortran_order);
  Tensor t = parse_npy(bytes);
  EXPECT_EQ(t.shape(), (Dims{2, 3}));
  EXPECT_THAT(Elements(t), ElementsAre(0, 2, 4, 1, 3, 5));
}

TEST_F(NpyTest, FortranOrderRank3AllDTypes) {
  // Fortran element (i, j, k) of shape (2, 3, 4) is stored at i + 2 j + 6 k.
  std::vector<Index> expected;
  for (Index i = 0; i < 2; ++i)
    for (Index j = 0; j < 3; ++j)
      for (Index k = 0; k < 4; ++k) expected.push_back(i + 2 * j + 6 * k);
  std::vector<double> f64;
  std::vector<std::int32_t> i32;
  std::vector<std::int64_t> i64;
  for (int i = 0; i < 24; ++i) {
    f64.push_back(i);
    i32.push_back(i);
    i64.push_back(i);
  }
  const std::string shape = "(2, 3, 4)";
  EXPECT_EQ(load_npy_index(Write("a.npy", MakeNpy(Dict("<i4", shape, true), Raw(i32)))), expected);
  EXPECT_EQ(load_npy_index(Write("b.npy", MakeNpy(Dict("<i8", shape, true), Raw(i64)))), expected);
  BasicTensor<double> d = load_npy_f64(Write("c.npy", MakeNpy(Dict("<f8", shape, true), Raw(f64))));
  EXPECT_EQ(d.shape(), (Dims{2, 3, 4}));
  for (std::size_t n = 0; n < 24; ++n) EXPECT_EQ(d[static_cast<Index>(n)], static_cast<double>(expected[n]));
  Tensor f = parse_npy(Bytes(MakeNpy(Dict("<f4", shape, true), Raw(Iota(24)))));
  for (std::size_t n = 0; n < 24; ++n) EXPECT_EQ(f[static_cast<Index>(n)], static_cast<float>(expected[n]));
}

TEST(NpyParse, TolerantHeaderSyntax) {
  const std::vector<std::string> dicts = {
      "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
      "{ \"descr\" : \"<f4\" ,\t'fortran_order':False,'shape':(2,3,) , }",
      "{'descr': '=f4', 'fortran_order': False, 'shape': (2L, 3L), }",
      "{'descr': 'f4', 'fortran_order': False, 'shape': ( 2 , 3 ), }\r\n   ",
      "\n {'fortran_order': False,\n 'shape': (+2, 3),\n 'descr': '<f4',\n }",
  };
  for (const std::string& dict : dicts) {
    SCOPED_TRACE(dict);
    Tensor t = parse_npy(Bytes(MakeNpy(dict, Raw(Iota(6)))));
    EXPECT_EQ(t.shape(), (Dims{2, 3}));
    EXPECT_EQ(Elements(t), Iota(6));
  }
}

TEST(NpyParse, ShapesOfEveryRankIncludingScalar) {
  EXPECT_EQ(parse_npy(Bytes(MakeNpy(Dict("<f4", "()"), Raw(Iota(1, 7.0f))))).rank(), 0);
  EXPECT_EQ(parse_npy(Bytes(MakeNpy(Dict("<f4", "(3,)"), Raw(Iota(3))))).shape(), (Dims{3}));
  EXPECT_EQ(parse_npy(Bytes(MakeNpy(Dict("<f4", "( 3 , )"), Raw(Iota(3))))).shape(), (Dims{3}));
  const std::string rank8 = "(1, 1, 2, 1, 1, 1, 1, 2)";
  EXPECT_EQ(parse_npy(Bytes(MakeNpy(Dict("<f4", rank8), Raw(Iota(4))))).rank(), 8);
}

TEST_F(NpyTest, IndexFromIntegerValuedFloats) {
  const std::string p =
      Write("f.npy", MakeNpy(Dict("<f4", "(3,)"), Raw(std::vector<float>{3, 0, -16777216})));
  EXPECT_THAT(load_npy_index(p), ElementsAre(3, 0, -16777216));
  const std::string q =
      Write("d.npy", MakeNpy(Dict("<f8", "(2,)"), Raw(std::vector<double>{-0x1p63, 0x1p62})));
  EXPECT_THAT(load_npy_index(q), ElementsAre(std::numeric_limits<Index>::min(), Index{1} << 62));
  const std::string r =
      Write("i.npy", MakeNpy(Dict("<i4", "(3,)"), Raw(std::vector<std::int32_t>{-5, 0, 7})));
  EXPECT_THAT(load_npy_index(r), ElementsAre(-5, 0, 7));
}

TEST_F(NpyTest, IndexRejectsNonIntegers) {
  for (double bad : {1.5, std::nan(""), 0x1p63, -1e300, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(bad);
    const std::string p = Write("d.npy", MakeNpy(Dict("<f8", "(2,)"), Raw(std::vector<double>{2.0, bad})));
    EXPECT_THAT([&] { load_npy_index(p); }, ThrowsError({p, "element 1", "is not an integer"}));
  }
}

TEST_F(NpyTest, FloatLoadersRejectIntegerArrays) {
  const std::string p = Write("i.npy", MakeNpy(Dict("<i8", "(1,)"), Raw(std::vector<std::int64_t>{1})));
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "expected a float32 or float64 array, found int64"}));
  EXPECT_THAT([&] { load_npy_f64(p); }, ThrowsError({p, "found int64"}));
  EXPECT_THAT([&] { parse_npy(Bytes(MakeNpy(Dict("<i4", "(1,)"), "abcd")), "mem"); },
              ThrowsError({"mem", "found int32"}));
}

// ---- reader errors -------------------------------------------------------------------------------

TEST_F(NpyTest, ErrorFileCannotBeOpened) {
  const std::string p = Path("missing.npy");
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "cannot open file for reading", "No such file"}));
  EXPECT_THAT([&] { load_npy_f64(p); }, ThrowsError({p, "cannot open"}));
  EXPECT_THAT([&] { load_npy_index(p); }, ThrowsError({p, "cannot open"}));
}

TEST_F(NpyTest, ErrorPathIsADirectory) {
  EXPECT_THAT([&] { load_npy(dir_.string()); }, ThrowsError({dir_.string(), "read error"}));
}

TEST_F(NpyTest, ErrorShorterThanMagic) {
  for (const char* contents : {"", "\x93NUM"}) {
    const std::string p = Write("short.npy", contents);
    EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "shorter than the 6-byte .npy magic"}));
  }
}

TEST_F(NpyTest, ErrorBadMagic) {
  std::string s = MakeNpy(Dict("<f4", "(1,)"), Raw(Iota(1)));
  s[5] = 'Z';
  const std::string p = Write("bad.npy", s);
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "bad magic: not a .npy file", "NUMPZ"}));
  EXPECT_THAT([&] { parse_npy(Bytes("PK\x03\x04 this is a zip"), "x.npz"); },
              ThrowsError({"x.npz", "bad magic"}));
}

TEST(NpyParse, ErrorUnsupportedVersion) {
  for (auto [major, minor] : {std::pair{4, 0}, {0, 0}, {1, 1}, {2, 5}, {255, 255}}) {
    const std::string s = MakeNpy(Dict("<f4", "(1,)"), Raw(Iota(1)), major, minor);
    EXPECT_THAT([&] { parse_npy_header(Bytes(s), "v.npy"); },
                ThrowsError({"v.npy", fmt::format("unsupported .npy format version {}.{}", major, minor)}));
  }
}

TEST(NpyParse, ErrorFileEndsInsideTheFixedPrefix) {
  EXPECT_THAT([&] { parse_npy_header(Bytes("\x93NUMPY"), "a"); },
              ThrowsError({"a", "ends inside the .npy version"}));
  EXPECT_THAT([&] { parse_npy_header(Bytes(std::string("\x93NUMPY\x01\x00\x10", 9)), "b"); },
              ThrowsError({"b", "ends inside the .npy header length"}));
  EXPECT_THAT([&] { parse_npy_header(Bytes(std::string("\x93NUMPY\x02\x00\x10\x00\x00", 11)), "c"); },
              ThrowsError({"c", "ends inside the .npy header length"}));
}

TEST_F(NpyTest, ErrorHeaderLengthPastEndOfFile) {
  std::string s = MakeNpy(Dict("<f4", "(1,)"), Raw(Iota(1)));
  s[8] = '\xff';
  s[9] = '\xff';
  const std::string p = Write("hl.npy", s);
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "header length 65535 runs past the end of the file"}));
  std::string v2 = MakeNpy(Dict("<f4", "(1,)"), Raw(Iota(1)), 2);
  v2[11] = '\x80';
  EXPECT_THAT([&] { parse_npy(Bytes(v2), "v2"); }, ThrowsError({"v2", "runs past the end of the file"}));
}

TEST(NpyParse, ErrorMalformedHeaderDict) {
  const std::string deep = "{'descr': " + std::string(200, '[') + "}";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'"},
      {"{'descr': '<f4', 'shape': (1,)}", "missing key 'fortran_order'"},
      {"{'fortran_order': False, 'shape': (1,)}", "missing key 'descr'"},
      {"{}", "missing key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", "unexpected key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", "duplicate key 'descr'"},
      {"", "expected '{'"},
      {"'descr': '<f4'", "expected '{'"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}", "expected ':'"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", "expected ',' or '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", "expected ',' or '}'"},
      {"{'descr': '<f4", "unterminated string"},
      {"{'descr': '<f4\\", "unterminated string"},
      {"{'descr': '<f4', 'fortran_order': false, 'shape': (1,)}", "unknown name 'false'"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", "'fortran_order' is 0, not True/False"},
      {"{'descr': '<f4', 'fortran_order': None, 'shape': (1,)}", "'fortran_order' is None"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", "'shape' is (1), not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", "'shape' is [1], not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': 1}", "'shape' is 1, not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,,)}", "unexpected character ','"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", "unexpected character ','"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}", "expected ',' or ')'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 'a')}", "shape entry 'a' is not an integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, (2,))}", "shape entry (2,) is not an integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-,)}", "expected a digit"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", "unexpected text after the closing '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}}", "unexpected text after the closing '}'"},
      {std::string("{'descr': '<f4',\0 'fortran_order': False, 'shape': (1,)}", 56),
       "unexpected character '\\x00'"},
      {"{1: 2}", "dict key 1 is not a string"},
      {"{'descr': 5, 'fortran_order': False, 'shape': (1,)}", "'descr' is 5, not a string"},
      {"{'descr': ", "unexpected end of header"},
      {deep, "nested too deeply"},
  };
  for (const auto& [dict, problem] : cases) {
    SCOPED_TRACE(dict);
    const auto bytes = Bytes(MakeNpy(dict, Raw(Iota(1))));
    EXPECT_THAT([&] { parse_npy_header(bytes, "hdr.npy"); },
                ThrowsError({"hdr.npy: malformed .npy header", problem}));
  }
}

TEST_F(NpyTest, ErrorRankAboveMax) {
  const std::string p = Write("r9.npy", MakeNpy(Dict("<f4", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), Raw(Iota(1))));
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "rank 9 exceeds the maximum rank 8"}));
}

TEST_F(NpyTest, ErrorNegativeDimension) {
  const std::string p = Write("neg.npy", MakeNpy(Dict("<f4", "(2, -3)"), Raw(Iota(6))));
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "negative dimension -3 in shape (2, -3)"}));
}

TEST(NpyParse, ErrorShapeOverflow) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(4294967296, 4294967296)", "is too large"},           // element count overflows
      {"(2305843009213693952,)", "is too large"},             // 2^61 float32 elements: bytes overflow
      {"(0, 4294967296, 4294967296)", "is too large"},        // zero-size, but the other dims overflow
      {"(99999999999999999999,)", "out of the int64 range"},  // not even an int64
  };
  for (const auto& [shape, problem] : cases) {
    SCOPED_TRACE(shape);
    const auto bytes = Bytes(MakeNpy(Dict("<f4", shape), Raw(Iota(4))));
    EXPECT_THAT([&] { parse_npy(bytes, "ov.npy"); }, ThrowsError({"ov.npy", problem}));
  }
}

TEST_F(NpyTest, ErrorTruncatedData) {
  const std::string p = Write("trunc.npy", MakeNpy(Dict("<f8", "(2, 3)"), Raw(std::vector<double>(5))));
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "truncated data", "needs 48 bytes", "has 40 bytes"}));
  EXPECT_THAT([&] { load_npy_index(p); }, ThrowsError({p, "truncated data"}));
}

TEST_F(NpyTest, ErrorExtraBytesAfterData) {
  const std::string p = Write("extra.npy", MakeNpy(Dict("<f4", "(2,)"), Raw(Iota(2)) + "xyz"));
  EXPECT_THAT([&] { load_npy(p); }, ThrowsError({p, "3 extra bytes after the data"}));
}

TEST(NpyParse, ErrorBigEndianDType) {
  for (const std::string d : {">f4", ">f8", ">i4", ">i8"}) {
    EXPECT_THAT([&] { parse_npy_header(Bytes(MakeNpy(Dict(d, "(1,)"), std::string(8, '\0'))), "be.npy"); },
                ThrowsError({"be.npy: unsupported dtype '" + d +
                             "' (normlab reads little-endian float32/float64/int32/int64)"}));
  }
}

TEST(NpyParse, ErrorOtherDTypes) {
  for (const std::string d :
       {"<f2", "|b1", "<c8", "<c16", "|f4", "|u1", "<u4", "<M8[ns]", "O", "<f4 ", "float32"}) {
    SCOPED_TRACE(d);
    EXPECT_THAT([&] { parse_npy_header(Bytes(MakeNpy(Dict(d, "(1,)"), std::string(4, '\0'))), "dt.npy"); },
                ThrowsError({"dt.npy: unsupported dtype '" + d + "'"}));
  }
  const std::string structured =
      "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (1,)}";
  EXPECT_THAT([&] { parse_npy_header(Bytes(MakeNpy(structured, std::string(8, '\0'))), "st.npy"); },
              ThrowsError({"st.npy: unsupported dtype [('a', '<f4'), ('b', '<i4')]", "structured dtypes"}));
}

// ---- writer --------------------------------------------------------------------------------------

TEST_F(NpyTest, WriterHeaderLayout) {
  const std::string p = Path("h.npy");
  save_npy(p, Tensor(Dims{3}, {1, 2, 3}).cview());
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict;
  expected.append(127 - expected.size(), ' ');
  expected += '\n';
  expected += Raw(std::vector<float>{1, 2, 3});
  EXPECT_EQ(ReadAll(p), expected);
}

TEST_F(NpyTest, WriterOverwritesAtomicallyAndLeavesNoTemporary) {
  const std::string p = Path("o.npy");
  save_npy(p, Tensor(Dims{4}).cview());
  save_npy(p, Tensor(Dims{2}, {5, 6}).cview());
  EXPECT_THAT(Elements(load_npy(p)), ElementsAre(5, 6));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(NpyTest, WriterErrorCannotOpen) {
  const std::string p = Path("no/such/dir/x.npy");
  EXPECT_THAT([&] { save_npy(p, Tensor(Dims{1}).cview()); }, ThrowsError({p, "cannot open", "for writing"}));
  EXPECT_THAT([&] { save_npy(p, BasicTensor<double>(Dims{1}).cview()); }, ThrowsError({p, "cannot open"}));
  const std::vector<Index> v = {1};
  EXPECT_THAT([&] { save_npy_index(p, v, Dims{1}); }, ThrowsError({p, "cannot open"}));
}

TEST_F(NpyTest, WriterErrorRenameFailsAndTemporaryIsRemoved) {
  const std::string p = Path("target.npy");
  fs::create_directories(fs::path(p) / "occupied");  // a non-empty directory cannot be replaced
  EXPECT_THAT([&] { save_npy(p, Tensor(Dims{1}).cview()); }, ThrowsError({p, "cannot rename"}));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(NpyTest, WriterErrorBadArguments) {
  const std::string p = Path("x.npy");
  EXPECT_THAT([&] { save_npy(p, ConstView()); }, ThrowsError({p, "cannot save an undefined view"}));
  const std::vector<Index> v = {1, 2, 3, 4, 5};
  EXPECT_THAT(
      [&] {
        save_npy_index(p, v, Dims{2, 3});
      },
      ThrowsError({p, "5 values for shape [2, 3] (6 elements)"}));
  EXPECT_THAT([&] { save_npy_index(p, v, Dims{5, -1}); }, ThrowsError({p, "negative dimension -1"}));
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

// ---- files written by NumPy ----------------------------------------------------------------------

TEST(NpyFixtures, Float32COrder) {
  Tensor t = load_npy(Fixture("f32_c.npy"));
  EXPECT_EQ(t.shape(), (Dims{2, 3}));
  EXPECT_THAT(Elements(t), ElementsAre(-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f));
}

TEST(NpyFixtures, Float64FortranOrder) {
  const std::string p = Fixture("f64_fortran.npy");
  EXPECT_TRUE(parse_npy_header(Bytes(ReadAll(p)), p).fortran_order);
  BasicTensor<double> d = load_npy_f64(p);
  EXPECT_EQ(d.shape(), (Dims{3, 4}));
  for (Index k = 0; k < 12; ++k) EXPECT_EQ(d[k], static_cast<double>(k) / 4) << k;
  Tensor f = load_npy(p);
  for (Index k = 0; k < 12; ++k) EXPECT_EQ(f[k], static_cast<float>(k) / 4) << k;
}

TEST(NpyFixtures, IntegerArrays) {
  EXPECT_THAT(load_npy_index(Fixture("i64.npy")), ElementsAre(3, 0, 7, 1));
  EXPECT_THAT(load_npy_index(Fixture("i32.npy")), ElementsAre(1, -2, 3, 4));
}

TEST(NpyFixtures, Version2) {
  const std::string p = Fixture("f32_v2.npy");
  EXPECT_EQ(parse_npy_header(Bytes(ReadAll(p)), p).version_major, 2);
  Tensor t = load_npy(p);
  EXPECT_EQ(t.shape(), (Dims{2, 2}));
  EXPECT_THAT(Elements(t), ElementsAre(0.25f, 1.25f, 2.25f, 3.25f));
}

TEST(NpyFixtures, ScalarAndEmpty) {
  BasicTensor<double> s = load_npy_f64(Fixture("f64_scalar.npy"));
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s[0], 2.5);
  Tensor e = load_npy(Fixture("f32_empty.npy"));
  EXPECT_EQ(e.shape(), (Dims{2, 0}));
}

TEST(NpyFixtures, UnsupportedDTypes) {
  const std::string be = Fixture("f32_be.npy");
  EXPECT_THAT(
      [&] { load_npy(be); },
      ThrowsError(
          {be + ": unsupported dtype '>f4' (normlab reads little-endian float32/float64/int32/int64)"}));
  const std::string f16 = Fixture("f16.npy");
  EXPECT_THAT([&] { load_npy(f16); }, ThrowsError({f16, "unsupported dtype '<f2'"}));
}

TEST_F(NpyTest, WriterMatchesNumPyByteForByte) {
  save_npy(Path("a.npy"), Tensor(Dims{2, 3}, {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f}).cview());
  EXPECT_EQ(ReadAll(Path("a.npy")), ReadAll(Fixture("f32_c.npy")));
  save_npy(Path("b.npy"), BasicTensor<double>(Dims{}, {2.5}).cview());
  EXPECT_EQ(ReadAll(Path("b.npy")), ReadAll(Fixture("f64_scalar.npy")));
  const std::vector<Index> v = {3, 0, 7, 1};
  save_npy_index(Path("c.npy"), v, Dims{4});
  EXPECT_EQ(ReadAll(Path("c.npy")), ReadAll(Fixture("i64.npy")));
}

// ---- fuzzing -------------------------------------------------------------------------------------

// Parses `bytes` with every in-memory entry point; anything but success or normlab::Error fails the test.
void ParseOrError(const std::vector<std::byte>& bytes) {
  try {
    const NpyHeader h = parse_npy_header(bytes, "fuzz");
    if (h.dtype == NpyDType::f32 || h.dtype == NpyDType::f64) {
      Tensor t = parse_npy(bytes, "fuzz");
      EXPECT_EQ(t.shape(), h.shape);
    }
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-normlab exception: " << e.what();
  }
}

TEST(NpyFuzz, EveryProperPrefixIsAnError) {
  for (const std::string& s : {MakeNpy(Dict("<f4", "(2, 3)"), Raw(Iota(6))),
                               MakeNpy(Dict("<f8", "(3,)", true), Raw(std::vector<double>(3)), 3)}) {
    for (std::size_t n = 0; n < s.size(); ++n) {
      const auto bytes = Bytes(s.substr(0, n));
      EXPECT_THROW(parse_npy_header(bytes, "prefix"), Error) << n;
    }
    EXPECT_NO_THROW(parse_npy_header(Bytes(s), "whole"));
  }
}

TEST(NpyFuzz, RandomMutationsOnlyThrowNormlabError) {
  const std::vector<std::string> seeds = {
      MakeNpy(Dict("<f4", "(2, 3)"), Raw(Iota(6))),
      MakeNpy(Dict("<f8", "(2, 2)", true), Raw(std::vector<double>(4)), 2),
      MakeNpy(Dict("<i8", "()"), Raw(std::vector<std::int64_t>{42})),
      MakeNpy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", Raw(Iota(1))),
  };
  const std::string alphabet = "{}()[],:'\" -0123456789LTrueFalseNonedescrshapefortran_order<>=|f4i8\n\x93";
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = seeds[static_cast<std::size_t>(iter) % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const std::size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[at] = static_cast<char>(rng());
          break;
        case 1:
          s[at] = alphabet[rng() % alphabet.size()];
          break;
        case 2:
          s.erase(at, 1 + rng() % 3);
          break;
        default:
          s.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
      }
    }
    ParseOrError(Bytes(s));
  }
}

}  // namespace
}  // namespace normlab
