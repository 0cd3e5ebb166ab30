#include "model/matmul_amx.h"

#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace vq {

namespace {

// The kernels' arguments.
amx_detail::Args make_args(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                           int64_t ldy) {
  VQ_CHECK(amx_supports(P.type), "amx: {} weights have no AMX kernel", ggml_type_name(P.type));
  VQ_CHECK(X.M > 16 && X.cols == P.cols && X.q != nullptr, "amx: {} activation rows of {} columns for a {} x {} weight",
           X.M, X.cols, P.rows, P.cols);
  amx_detail::Args a{};
  a.base = P.data.data();
  a.chunk = int64_t(chunk_bytes(P.type));
  a.rows = P.rows;
  a.g0 = g0;
  a.g1 = g1;
  a.M = X.M;
  a.cols = X.cols;
  a.q = X.q;
  a.d = X.d;
  a.y = y;
  a.ldy = ldy;
  return a;
}

}  // namespace

bool amx_available() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx = (d >> 24 & 1) && (d >> 25 & 1);       // AMX-TILE, AMX-INT8
    const bool avx512 = (b >> 16 & 1) && (b >> 31 & 1);    // AVX512F, AVX512VL (the fix-ups)
    if (!amx || !avx512 || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) return false;
    // The kernel lets a process use the tile data state only when asked (ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA); refused (an old kernel, a sandbox), the tiles would fault.
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

bool amx_supports(GGMLType t) { return t == GGMLType::Q8_0; }

void amx_groups(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy) {
  VQ_CHECK(amx_available(), "amx: this CPU (or the OS) does not offer AMX tiles");
  amx_detail::run_hw(make_args(P, g0, g1, X, y, ldy));
}

void amx_groups_emulated(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                         int64_t ldy) {
#if defined(__x86_64__)
  VQ_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"),
           "amx: the emulated tiles need AVX2, FMA and F16C");
  amx_detail::run_emu(make_args(P, g0, g1, X, y, ldy));
#else
  (void)P, (void)g0, (void)g1, (void)X, (void)y, (void)ldy;
  VQ_CHECK(false, "amx: not an x86-64 build");
#endif
}

}  // namespace vq
