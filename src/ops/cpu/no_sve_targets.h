// Included first (before any Highway header) by the CPU kernels whose register tiles are arrays of
// vectors, which SVE's sizeless vector types cannot form: Highway's SVE targets are left out of
// that translation unit, and on SVE hardware its NEON target runs (Highway picks among the targets
// each translation unit compiled). scripts/check_aarch64.sh checks that everything builds.
// No include guard on purpose: it only defines HWY_DISABLED_TARGETS where nothing did.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
