// Instruction-set dispatch (normlab/simd.h): names, what this CPU supports, the default choice, and the
// avx512bf16 target's table (avx512's kernels but for the bf16 rounding entries). That every target gives
// the same bits is tested with each kernel family (tests/norm/*_test.cpp loop over supported_isas()).
#include <gtest/gtest.h>
#include <normlab/simd.h>
#include <normlab/tensor.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "norm/convert_kernels.h"

namespace normlab {
namespace {

constexpr Isa kAll[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16};

// The target chosen at start-up, before any test calls set_isa.
const Isa kStartIsa = active_isa();

TEST(Dispatch, NamesRoundTrip) {
  EXPECT_STREQ(isa_name(Isa::kScalar), "scalar");
  EXPECT_STREQ(isa_name(Isa::kAvx2), "avx2");
  EXPECT_STREQ(isa_name(Isa::kAvx512), "avx512");
  EXPECT_STREQ(isa_name(Isa::kAvx512Bf16), "avx512bf16");
  for (Isa isa : kAll) EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  try {
    parse_isa("avx512-bf16");
    FAIL() << "no error for an unknown name";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unknown instruction set 'avx512-bf16' (valid: scalar, avx2, avx512, avx512bf16)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Dispatch, SupportedTargetsAreOrderedAndNested) {
  const std::vector<Isa> s = supported_isas();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.front(), Isa::kScalar);
  for (Isa isa : kAll)
    EXPECT_EQ(isa_supported(isa), std::find(s.begin(), s.end(), isa) != s.end()) << isa_name(isa);
  // Each target needs the one before it (avx512bf16 adds one instruction to avx512).
  if (isa_supported(Isa::kAvx512Bf16)) {
    EXPECT_TRUE(isa_supported(Isa::kAvx512));
  }
  if (isa_supported(Isa::kAvx512)) {
    EXPECT_TRUE(isa_supported(Isa::kAvx2));
  }
  for (Isa isa : kAll)
    if (!isa_supported(isa)) {
      EXPECT_THROW(set_isa(isa), Error) << isa_name(isa);
    }
}

TEST(Dispatch, DefaultIsTheBestSupportedTargetOrNormlabIsa) {
  const char* env = std::getenv("NORMLAB_ISA");
  if (env && *env) {
    EXPECT_EQ(kStartIsa, parse_isa(env));
  } else {
    EXPECT_EQ(kStartIsa, supported_isas().back());
  }
}

// avx512bf16 replaces exactly the entries that round to bf16; everything else is avx512's code.
TEST(Dispatch, Avx512Bf16SharesEveryKernelButTheBf16Stores) {
  if (!isa_supported(Isa::kAvx512Bf16)) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const Isa saved = active_isa();
  set_isa(Isa::kAvx512);
  const kernels::ConvertKernels a = kernels::convert_kernels();
  const kernels::RowKernels* ra = &kernels::row_kernels();
  set_isa(Isa::kAvx512Bf16);
  const kernels::ConvertKernels b = kernels::convert_kernels();
  const kernels::RowKernels* rb = &kernels::row_kernels();
  set_isa(saved);
  EXPECT_EQ(ra, rb);
  EXPECT_NE(a.narrow[kernels::kBf16], b.narrow[kernels::kBf16]);
  EXPECT_NE(a.rows_forward_bf16, b.rows_forward_bf16);
  EXPECT_NE(a.rows_backward_bf16, b.rows_backward_bf16);
  EXPECT_EQ(a.narrow[kernels::kF16], b.narrow[kernels::kF16]);
  EXPECT_EQ(a.widen[kernels::kBf16], b.widen[kernels::kBf16]);
  EXPECT_EQ(a.widen[kernels::kF16], b.widen[kernels::kF16]);
  EXPECT_EQ(a.recover_centered, b.recover_centered);
  EXPECT_EQ(a.rows_forward_f16, b.rows_forward_f16);
  EXPECT_EQ(a.rows_backward_f16, b.rows_backward_f16);
}

}  // namespace
}  // namespace normlab
