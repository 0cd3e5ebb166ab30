// fp16 and fp32: the uncompressed KV methods (dense blocks only, no coded format, no options).
#include "kvcache/kv_method.h"

namespace vq {
namespace {

class Fp16Method final : public KVMethodDef {
 public:
  KVMethod id() const override { return KVMethod::fp16; }
  std::string name() const override { return "fp16"; }
  std::vector<std::string> heads() const override { return {"fp16", "f16"}; }
  std::string help() const override { return "  fp16, fp32           uncompressed; no options\n"; }
  double bits_per_element(const KVCacheConfig&) const override { return 16.0; }
  bool has_device_format() const override { return true; }
  // The device pool's dense blocks take any power-of-two block size >= 32 (checked by the store).
};

class Fp32Method final : public KVMethodDef {
 public:
  KVMethod id() const override { return KVMethod::fp32; }
  std::string name() const override { return "fp32"; }
  std::vector<std::string> heads() const override { return {"fp32", "f32"}; }
  std::string help() const override { return ""; }  // listed on fp16's line
  double bits_per_element(const KVCacheConfig&) const override { return 32.0; }
  bool dense_f32() const override { return true; }
  bool evaluated() const override { return false; }  // fp16 is eval's reference; fp32 adds nothing
  std::string device_why_not() const override {
    return "the device's dense blocks and kernels are fp16 (fp32 exists as the CPU's exact reference)";
  }
};

}  // namespace

const KVMethodDef& fp16_method() {
  static const Fp16Method m;
  return m;
}
const KVMethodDef& fp32_method() {
  static const Fp32Method m;
  return m;
}

}  // namespace vq
