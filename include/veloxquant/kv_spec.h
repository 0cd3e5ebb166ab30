#pragma once
// KVSpec: a KV cache method ready to run, i.e. a validated KVCacheConfig plus, for VecInfer, its
// calibration. Made from a spec string: kv_cache_methods() lists the registered methods' presets
// ("fp16", "q8_0", "kivi2", "vecinfer:d4b8", ...), kv_cache_spec_help() the whole syntax
// (options after ':' or ',', e.g. r=N fp16 residual window, g=N KIVI group). Case-insensitive; a
// method alone is its default preset; an empty option list or an unknown option is an error.
// Every error (bad spec, missing or unreadable calibration) is a vq::Error thrown here, before
// any model work. An immutable, cheaply copied handle.
#include <memory>
#include <string>
#include <vector>

#include "veloxquant/calibration.h"
#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"
#include "veloxquant/runtime.h"
#include "veloxquant/status.h"

namespace veloxquant {

class Model;

// Parses a spec string into a config without loading anything (vecinfer's calibration is not
// looked for); throws vq::Error naming the part at fault.
KVCacheConfig parse_kv_cache_config(const std::string& spec);
// The presets of every registered KV method, in registration order (the library's method list).
std::vector<std::string> kv_cache_methods();
// The spec syntax, several lines (what `veloxquant generate --help` prints).
std::string kv_cache_spec_help();
// Whether the config's method runs on trained codebooks (a Calibration): vecinfer.
bool kv_cache_needs_calibration(const KVCacheConfig& config);

class KVSpec {
 public:
  // vecinfer needs calibration: calibration_file, else the config's calibration_file; without
  // either it throws saying how to make one.
  static KVSpec parse(const std::string& spec, const std::string& calibration_file = "");
  static KVSpec parse(const std::string& spec, const Calibration& calibration);
  static KVSpec from_config(const KVCacheConfig& config, const std::string& calibration_file = "");
  // For a model: as parse(), except that VecInfer on a known model (Model::is_default) without a
  // calibration file uses the cached first-use calibration, training it now (about a minute on 2
  // cores, from the Jargon File of the Debian package jargon-text) when absent. The calibration is checked against the spec and the model's
  // geometry, and a calibration_file must record this model; errors name the file. The CLI and
  // the server take their specs from the same function (src/eval/calibrate.h model_kv_spec).
  static KVSpec for_model(const Model& model, const std::string& spec, const std::string& calibration_file = "");
  // The same from a parsed config, reporting a first-use calibration's progress and setting *made
  // when it trained one now (the same file serves a cache on either device).
  static KVSpec for_model_config(const Model& model, const KVCacheConfig& config,
                                 const std::string& calibration_file = "", const CalibrationProgress& progress = {},
                                 bool* made = nullptr);

  const KVCacheConfig& config() const;
  std::string name() const;  // canonical spec string, e.g. "vecinfer:d4b8"
  double nominal_bits_per_element() const;  // of the compressed part (16 for fp16)
  bool has_calibration() const;
  Calibration calibration() const;  // throws vq::Error when the method has none
  // "" unless the calibration's held-out check (Calibration::held_out_check) measured a KL vs fp16
  // above the 0.02 this project targets for 2-bit caches; then one line with the numbers and
  // what to use instead, for the caller to show (the CLI prints it as a warning).
  std::string quality_warning() const;

  // A standalone cache for one layer of the given geometry (KVCache interface, kv_cache.h), for
  // code that drives attention by hand; layer selects the calibration's codebooks.
  std::unique_ptr<KVCache> make_cache(int layer, const KVGeometry& geometry) const;
  KVCacheFactory cache_factory() const;  // the same, as a factory

  struct Impl;

 private:
  friend struct ApiAccess;  // src/api: reaches the internal spec
  explicit KVSpec(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace veloxquant
