// Issue throughput of the 512-bit instructions the norm kernels are made of, alone and in pairs: which
// execution pipes they share on this machine. docs/PERFORMANCE.md ("2026-11-30, fourth session") quotes it
// for the choice in src/simd/vec.h of fma(a, 1, b) for the double additions (Zen 4 issues a 512-bit add, a
// conversion and an integer shift to the same add pipes, a multiply or FMA to others).
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
  return 0;
}
