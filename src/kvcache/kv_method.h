#pragma once
// The KV method registry: every KV cache method (fp16, q8_0, kivi, vecinfer, ...) is one
// KVMethodDef, defined in its own file under kvcache/methods/ and listed once in
// kvcache/methods/list.h. Everything that used to switch on the method (the spec parser and its
// help, validation, the canonical name, bits per element, the store's window/sink rules, the CPU
// coded format, the device support check, the CLI/server/eval/Python method lists) asks the
// registry instead. docs/HOWTO-add-a-kv-method.md walks through adding one.
#include <memory>
#include <string>
#include <vector>

#include "kvcache/kv_format.h"
#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

// One spec option a method takes: its canonical key ("r") and the longer spellings ("residual").
// The key "" is a bare value (vecinfer's "d4b8").
// llama.cpp's scalar block types of 32 elements that the device kernels read and write
// (ops/cuda/scalar_blocks.cuh): a direct method whose blocks are one of them runs on the device.
enum class DeviceScalarBlocks { none, q8_0, q4_0, q5_0 };
struct DeviceScalar {
  DeviceScalarBlocks blocks = DeviceScalarBlocks::none;
  bool rotated = false;  // rows, queries and the output through the Walsh-Hadamard rotation (q4_0h)
};

struct KVSpecOption {
  std::string key;
  std::vector<std::string> aliases;
};

class KVMethodDef {
 public:
  virtual ~KVMethodDef() = default;

  // ---- identity and spec syntax ----
  virtual KVMethod id() const = 0;
  virtual std::string name() const = 0;  // method_name(): "kivi"
  // The spec heads (text before ':' or ',') this method answers to; take_head() sets what the
  // head implies (kivi4: 4 bits). Default: the name alone.
  virtual std::vector<std::string> heads() const { return {name()}; }
  virtual void take_head(const std::string& head, KVCacheConfig& c) const;
  // The options this method takes after the head (besides gpu=, taken by all).
  virtual std::vector<KVSpecOption> options(const std::string& head) const { return {}; }
  // The slots an option fills, for the given-twice check (vecinfer's bare preset fills k and v).
  virtual std::vector<std::string> slots(const std::string& key) const { return {key}; }
  virtual std::string slot_label(const std::string& slot) const { return "option '" + slot + "'"; }
  // Applies one option (key canonical). spec: the whole spec string, for messages.
  virtual void set_option(const std::string& key, const std::string& value, KVCacheConfig& c,
                          const std::string& spec) const;
  // Cross-option rules once every option is read; seen: the slots given.
  virtual void check_options(const std::vector<std::string>& seen, const std::string& spec) const {}
  // Help text lines for the spec syntax (each starting with two spaces, ending with '\n').
  virtual std::string help() const = 0;
  // Spec strings of the presets shipped (eval's default list); each parses.
  virtual std::vector<std::string> presets() const { return {name()}; }
  // Whether eval's default list (every shipped method against fp16) takes the presets.
  virtual bool evaluated() const { return true; }
  // Example specs for the help text (each parses).
  virtual std::vector<std::string> examples() const { return {}; }
  // The canonical spec string (KVCacheConfig::name(); part of the KV identity: keep it stable).
  virtual std::string canonical(const KVCacheConfig& c) const { return name(); }

  // ---- rules ----
  // The method's own fields; hd > 0: the model's head_dim. Throws naming the field.
  virtual void validate(const KVCacheConfig& c, int hd) const {}
  virtual double bits_per_element(const KVCacheConfig& c) const = 0;
  virtual bool dense_f32() const { return false; }  // the dense form holds fp32 (fp32)
  // windowed: the most recent residual_length tokens stay fp16 and whole blocks are coded as
  // they leave; direct: every token is coded on append (no fp16 form); neither: dense only.
  virtual bool windowed() const { return false; }
  virtual bool direct() const { return false; }
  virtual int sink_tokens(const KVCacheConfig&) const { return 0; }  // first tokens kept fp16
  virtual int default_block_tokens(const KVCacheConfig&) const { return 32; }
  virtual bool needs_calibration() const { return false; }

  // ---- formats ----
  // The CPU coded format of one layer; nullptr for a dense-only method.
  virtual std::unique_ptr<CodedFormat> make_format(const KVCacheConfig& c, const Calibration* calib, int layer,
                                                   const KVGeometry& g, int block_tokens) const {
    return nullptr;
  }
  // Whether the device pool (KVDevice::cuda) has kernels for this method, and, when it has, why
  // this config / geometry / block size cannot run there ("" when it can).
  virtual bool has_device_format() const { return false; }
  // A direct method with a device format: its blocks as the device's scalar block type
  // ([2 (K, V)][n_kv_heads][block_tokens][head_dim/32 blocks], the CPU format's own layout); the
  // device codes each row on append and its attention kernels dequantize the rows into their
  // fp16 tiles. none: fp16 and vecinfer (the store's own device paths).
  virtual DeviceScalar device_scalar() const { return {}; }
  // Without a device format: why the device does not run it (the one place that says so; the
  // refusal on --device cuda quotes it).
  virtual std::string device_why_not() const {
    return "no device attention kernel reads its blocks (the device kernels read fp16 blocks, llama.cpp's per-token "
           "scalar blocks and VecInfer codes)";
  }
  virtual std::string device_unsupported(const KVCacheConfig& c, const KVGeometry& g, int block_tokens) const {
    return "";
  }
};

// Every registered method, in registration order (kvcache/methods/list.h).
const std::vector<const KVMethodDef*>& kv_methods();
// The method of an id (throws for an id no method registered).
const KVMethodDef& kv_method(KVMethod id);
// The method answering to a spec head, or nullptr.
const KVMethodDef* find_kv_method_by_head(const std::string& head);
// The presets of every method (the CLI/server/Python method lists); evaluated_only: those eval
// compares by default.
std::vector<std::string> kv_method_presets(bool evaluated_only = false);
// "fp16, q8_0, ... and vecinfer": the methods with device kernels, in registration order.
std::string kv_device_method_names();

// Helpers for methods' option parsers: throw naming the spec and the bad part.
int parse_spec_int(const std::string& value, const std::string& spec, const char* what);
PQPreset parse_spec_preset(const std::string& value, const std::string& spec);

}  // namespace vq
