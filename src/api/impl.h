#pragma once
// Private to src/api: what the public handles hold, and the conversions between public and
// internal types. The public headers never include this (nor anything else under src/).
#include <memory>
#include <string>

#include "codec/calibration_file.h"
#include "kvcache/kv_store.h"
#include "model/model.h"
#include "model/sampler.h"
#include "veloxquant/calibration.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/sampling.h"
#include "veloxquant/runtime.h"
#include "veloxquant/session.h"

namespace veloxquant {

struct Model::Impl {
  std::unique_ptr<vq::Model> model;
  ModelInfo info;
  bool is_default = false;
};

struct KVSpec::Impl {
  vq::KVSpec spec;
};

struct ApiAccess {
  static const vq::Model& model(const Model& m) { return *m.impl_->model; }
  static const Model::Impl& model_impl(const Model& m) { return *m.impl_; }
  static Model make_model(std::shared_ptr<const Model::Impl> impl) { return Model(std::move(impl)); }
  static const vq::Tokenizer& tokenizer(const Tokenizer& t) { return t.model_->model->tokenizer(); }
  static Tokenizer make_tokenizer(const Model& m) { return Tokenizer(m.impl_); }
  static const vq::KVSpec& spec(const KVSpec& s) { return s.impl_->spec; }
  static Calibration make_calibration(std::shared_ptr<const vq::Calibration> c) { return Calibration(std::move(c)); }
  static KVSpec make_spec(vq::KVSpec spec) {
    return KVSpec(std::make_shared<const KVSpec::Impl>(KVSpec::Impl{std::move(spec)}));
  }
};

vq::SamplerParams to_internal(const SamplingParams& p);
// Device::cuda without a usable device throws, naming the reason.
vq::KVDevice to_internal(Device d);
vq::Granularity to_internal(CodebookGranularity g);
CodebookGranularity to_public(vq::Granularity g);
// A model's calibration must match its layers and KV heads: checked when a spec meets a model.
void check_spec_fits(const KVSpec& spec, const Model& model);
// One block of every form in every layer of the store: the least budget that runs anything.
size_t min_budget_bytes(const vq::KVStore& kv);
// Positions a session or engine holds when the caller says 0: the model's training context.
int default_n_ctx(const Model& model);

}  // namespace veloxquant
