// Issue throughput of the 512-bit instructions the norm kernels are made of, alone and in pairs: which
// execution pipes they share on this machine. docs/PERFORMANCE.md ("2026-11-30, fourth session") quotes it
// for the choice in src/simd/vec.h of fma(a, 1, b) for the double additions (Zen 4 issues a 512-bit add, a
// conversion and an integer shift to the same add pipes, a multiply or FMA to others). The probes after the
// first fourteen (2026-12-02, "nineteenth session") place the integer multiplies (vpmulld, vpmaddwd: with the
// float multiplies), the logic operations, the widening and narrowing shuffles and AVX512_BF16's rounding.
//
// Each measurement runs 12 instructions with 12 independent destinations per loop iteration (no dependency
// between them; sources are zmm16/zmm17 or one cache line), kIters times, and prints nanoseconds per
// instruction. Two instructions that share no pipe run in the time of the slower alone; two that share
// one add up. Needs AVX-512 (F, DQ, BW) at run time; the loop is inline assembly, so the compiler's
// flags do not matter.
//
//   build/release/bench/normlab_bench_pipes
#include <chrono>
#include <cstdio>

namespace {

constexpr long kIters = 20'000'000;
alignas(64) float g_line[16];

// 12 copies of one instruction (or an alternation of two) on destinations 0..11.
#define NL_12(A, B) A(0) B(1) A(2) B(3) A(4) B(5) A(6) B(7) A(8) B(9) A(10) B(11)
#define NL_CLOBBER \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"

#define VADDPS(r) "vaddps %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VMULPS(r) "vmulps %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VFMAPS(r) "vfmadd231ps %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VADDPD(r) "vaddpd %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VFMAPD(r) "vfmadd231pd %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VCVT(r) "vcvtps2pd %%ymm16, %%zmm" #r "\n\t"
#define VCVTM(r) "vcvtps2pd (%0), %%zmm" #r "\n\t"
#define VPADDD(r) "vpaddd %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VPSRLD(r) "vpsrld $16, %%zmm16, %%zmm" #r "\n\t"
#define VPERMW(r) "vpermw %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VPMULLD(r) "vpmulld %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VPANDD(r) "vpandd %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VPSLLDY(r) "vpslld $16, %%ymm16, %%ymm" #r "\n\t"
#define VPMOVZXWD(r) "vpmovzxwd (%0), %%ymm" #r "\n\t"
#define VCVTBF16(r) "vcvtneps2bf16 %%zmm16, %%ymm" #r "\n\t"
#define VPMADDWD(r) "vpmaddwd %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VPMOVDW(r) "vpmovdw %%zmm16, %%ymm" #r "\n\t"
#define VPMOVZXWDZ(r) "vpmovzxwd (%0), %%zmm" #r "\n\t"
#define VPMOVZXWDZR(r) "vpmovzxwd %%ymm16, %%zmm" #r "\n\t"
#define VPSHUFB(r) "vpshufb %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define VPERMWM(r) "vpermw (%0), %%zmm17, %%zmm" #r "\n\t"
// (k1 is not in the clobbers: this file is compiled without AVX-512, so the compiler never uses a mask
// register)
#define VFPCLASS(r) "vfpclassps $0x20, %%zmm16, %%k1\n\t"
#define VPERMT2PD(r) "vpermt2pd %%zmm16, %%zmm17, %%zmm" #r "\n\t"

#define NL_PROBE(name, A, B)                                                                                \
  {                                                                                                         \
    const auto t0 = std::chrono::steady_clock::now();                                                       \
    for (long i = 0; i < kIters; ++i) __asm__ volatile(NL_12(A, B) : : "r"(g_line) : NL_CLOBBER, "memory"); \
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();          \
    std::printf("%-36s %6.3f ns per instruction\n", name, s / (kIters * 12.0) * 1e9);                       \
  }

}  // namespace

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq") ||
      !__builtin_cpu_supports("avx512bw")) {
    std::printf("this CPU has no AVX-512 (F, DQ, BW): nothing to probe\n");
    return 0;
  }
  NL_PROBE("vpaddd", VPADDD, VPADDD)
  NL_PROBE("vaddps", VADDPS, VADDPS)
  NL_PROBE("vmulps", VMULPS, VMULPS)
  NL_PROBE("vcvtps2pd ymm->zmm", VCVT, VCVT)
  NL_PROBE("vpsrld", VPSRLD, VPSRLD)
  NL_PROBE("vpermw", VPERMW, VPERMW)
  NL_PROBE("vaddps + vmulps", VADDPS, VMULPS)
  NL_PROBE("vaddps + vfmadd231ps", VADDPS, VFMAPS)
  NL_PROBE("vcvtps2pd + vaddps", VCVT, VADDPS)
  NL_PROBE("vcvtps2pd + vmulps", VCVT, VMULPS)
  NL_PROBE("vpsrld + vaddps", VPSRLD, VADDPS)
  NL_PROBE("vpsrld + vmulps", VPSRLD, VMULPS)
  NL_PROBE("vcvtps2pd (mem) + vaddpd", VCVTM, VADDPD)
  NL_PROBE("vcvtps2pd (mem) + vfmadd231pd", VCVTM, VFMAPD)
  NL_PROBE("vpmulld", VPMULLD, VPMULLD)
  NL_PROBE("vpmulld + vaddps", VPMULLD, VADDPS)
  NL_PROBE("vpmulld + vmulps", VPMULLD, VMULPS)
  NL_PROBE("vpandd", VPANDD, VPANDD)
  NL_PROBE("vpandd + vaddps", VPANDD, VADDPS)
  NL_PROBE("vpslld ymm", VPSLLDY, VPSLLDY)
  NL_PROBE("vpslld ymm + vaddps", VPSLLDY, VADDPS)
  NL_PROBE("vpmovzxwd mem->ymm", VPMOVZXWD, VPMOVZXWD)
  NL_PROBE("vpmovzxwd mem->ymm + vaddps", VPMOVZXWD, VADDPS)
  NL_PROBE("vpermt2pd", VPERMT2PD, VPERMT2PD)
  NL_PROBE("vpermt2pd + vaddps", VPERMT2PD, VADDPS)
  NL_PROBE("vpermw + vaddps", VPERMW, VADDPS)
  NL_PROBE("vpermw + vmulps", VPERMW, VMULPS)
  NL_PROBE("vpermw (mem) + vaddps", VPERMWM, VADDPS)
  NL_PROBE("vpmaddwd", VPMADDWD, VPMADDWD)
  NL_PROBE("vpmaddwd + vaddps", VPMADDWD, VADDPS)
  NL_PROBE("vpmaddwd + vmulps", VPMADDWD, VMULPS)
  NL_PROBE("vpmovdw zmm->ymm", VPMOVDW, VPMOVDW)
  NL_PROBE("vpmovdw + vaddps", VPMOVDW, VADDPS)
  NL_PROBE("vpmovdw + vmulps", VPMOVDW, VMULPS)
  NL_PROBE("vpmovzxwd mem->zmm", VPMOVZXWDZ, VPMOVZXWDZ)
  NL_PROBE("vpmovzxwd mem->zmm + vaddps", VPMOVZXWDZ, VADDPS)
  NL_PROBE("vpmovzxwd mem->zmm + vmulps", VPMOVZXWDZ, VMULPS)
  NL_PROBE("vpmovzxwd ymm->zmm + vaddps", VPMOVZXWDZR, VADDPS)
  NL_PROBE("vpmovzxwd mem->zmm + vpermw", VPMOVZXWDZ, VPERMW)
  NL_PROBE("vpshufb + vaddps", VPSHUFB, VADDPS)
  NL_PROBE("vpmulld + vcvtps2pd", VPMULLD, VCVT)
  if (__builtin_cpu_supports("avx512bf16")) {
    NL_PROBE("vcvtneps2bf16 zmm->ymm", VCVTBF16, VCVTBF16)
    NL_PROBE("vcvtneps2bf16 + vaddps", VCVTBF16, VADDPS)
    NL_PROBE("vcvtneps2bf16 + vmulps", VCVTBF16, VMULPS)
    NL_PROBE("vfpclassps", VFPCLASS, VFPCLASS)
    NL_PROBE("vfpclassps + vaddps", VFPCLASS, VADDPS)
  }
  return 0;
}
