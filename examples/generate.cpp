// Generates text from the default model (SmolLM2-135M-Instruct, fetched on first use) with a
// 2-bit VecInfer KV cache, then prints how much memory the cache saved against fp16.
//   vq_generate_example ["prompt"] [kv spec, default vecinfer:d4b8] [tokens, default 64]
#include <veloxquant/veloxquant.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  namespace vx = veloxquant;
  try {
    const std::string prompt = argc > 1 ? argv[1] : "Why is the sky blue?";
    const std::string spec_string = argc > 2 ? argv[2] : "vecinfer:d4b8";
    const vx::Model model = vx::Model::load_default();
    // For the default model, VecInfer's calibration is made on first use and then cached.
    const vx::KVSpec spec = vx::KVSpec::for_model(model, spec_string);

    vx::GenerateOptions opt;
    opt.max_new_tokens = argc > 3 ? std::stoi(argv[3]) : 64;
    opt.sampling = vx::SamplingParams::greedy();
    const std::string chat = model.tokenizer().apply_chat_template({{"user", prompt}});
    const vx::Generation g = vx::generate(model, spec, chat, opt, [&model](int32_t t) {
      std::fputs(model.tokenizer().piece(t).c_str(), stdout);  // streamed as it comes
      std::fflush(stdout);
      return true;
    });

    const vx::KVMemory& m = g.result.memory;
    std::printf("\n%s: %lld prompt + %lld generated tokens, KV %zu bytes vs fp16 %zu (%.2f bits/element, %.0f%% saved)\n",
                spec.name().c_str(), (long long)g.result.n_prompt, (long long)g.result.n_generated, m.token_bytes,
                m.fp16_bytes, m.bits_per_element(), 100.0 * m.saved_fraction());
    return 0;
  } catch (const vx::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
