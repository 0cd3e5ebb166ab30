// libFuzzer target for the calibration-file reader (codec/calibration_file): any byte string
// must either load or throw vq::Error, never crash or read outside the input, and whatever loads
// must satisfy the file's contract: sizes consistent with the header, every value finite and
// within kMaxCalibrationValue, smoothing factors in [kMinLambda, kMaxCalibrationValue], and a
// spec and geometry built from its own header must match it (check_calibration_matches).
// Each input is tried twice: as given (mutations mostly meet the checksum) and with its trailing
// checksum rewritten to match, so that mutations reach the header and value checks behind it.
// Built by fuzz/run_fuzz.sh --target calibration (docs/FUZZING.md).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codec/calibration_check.h"
#include "codec/calibration_file.h"
#include "codec/key_transform.h"
#include "core/checksum.h"
#include "core/error.h"

namespace {

void check_loaded(const vq::Calibration& c) {
  // Anything that loads is usable: these must hold, or the reader's checks have a hole.
  if (c.layers.size() != size_t(c.n_layers)) std::abort();
  for (const auto& L : c.layers) {
    if (L.key_codebooks.size() != c.key_codebook_floats() || L.value_codebooks.size() != c.value_codebook_floats())
      std::abort();
    for (float v : L.smoothing)
      if (!(v >= vq::kMinLambda && v <= vq::kMaxCalibrationValue)) std::abort();
    for (const auto* books : {&L.key_codebooks, &L.value_codebooks})
      for (float v : *books)
        if (!(std::fabs(v) <= vq::kMaxCalibrationValue)) std::abort();
  }
  vq::KVCacheConfig cfg;
  cfg.method = vq::KVMethod::vecinfer;
  cfg.key = {c.key.sub_dim, c.key.bits};
  cfg.value = {c.value.sub_dim, c.value.bits};
  cfg.granularity = c.granularity == vq::Granularity::shared ? vq::CodebookGranularity::shared
                                                              : vq::CodebookGranularity::per_subspace;
  vq::check_calibration_matches(c, cfg, vq::KVGeometry{c.n_kv_heads, c.n_kv_heads, c.head_dim}, c.n_layers);
}

void try_load(const uint8_t* data, size_t size) {
  try {
    check_loaded(vq::parse_calibration(data, size, "fuzz.vqcal"));
  } catch (const vq::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try_load(data, size);
  if (size >= 8) {
    std::vector<uint8_t> b(data, data + size);
    const uint64_t sum = vq::checksum64(b.data(), size - 8);
    std::memcpy(b.data() + size - 8, &sum, 8);
    try_load(b.data(), b.size());
  }
  return 0;
}
