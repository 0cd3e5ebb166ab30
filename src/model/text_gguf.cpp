// The tokenizer.ggml.* metadata keys into TokenizerData; the chat template from the metadata.
#include "model/text_gguf.h"

#include <algorithm>

#include "core/error.h"

namespace vq {

TokenizerData tokenizer_data_from_gguf(const GGUFFile& g) {
  TokenizerData d;
  VQ_CHECK(g.has("tokenizer.ggml.model"), "{}: no tokenizer (metadata key tokenizer.ggml.model is missing)", g.path());
  d.model = g.get_string("tokenizer.ggml.model");
  VQ_CHECK(d.model == "gpt2" || d.model == "llama",
           "{}: tokenizer.ggml.model '{}' is not supported (expected 'gpt2' or 'llama')", g.path(), d.model);
  const bool spm = d.model == "llama";
  d.pre = g.get_string_or("tokenizer.ggml.pre", "default");
  d.tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (g.has("tokenizer.ggml.scores")) {
    for (double s : g.get_float_array("tokenizer.ggml.scores")) d.scores.push_back(static_cast<float>(s));
  }
  if (g.has("tokenizer.ggml.token_type")) {
    for (int64_t t : g.get_int_array("tokenizer.ggml.token_type")) {
      VQ_CHECK(t >= 0 && t <= 6, "{}: tokenizer.ggml.token_type holds {} (expected 0..6)", g.path(), t);
      d.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  if (!spm && g.has("tokenizer.ggml.merges")) d.merges = g.get_string_array("tokenizer.ggml.merges");
  auto id = [&](const char* key, int64_t def) {
    const int64_t v = g.get_int_or(key, def);
    VQ_CHECK(v >= -1 && v < static_cast<int64_t>(d.tokens.size()),
             "{}: {} = {} is outside the vocabulary of {} tokens", g.path(), key, v, d.tokens.size());
    return static_cast<int32_t>(v);
  };
  // SentencePiece vocabularies put <unk>, <s>, </s> at 0, 1, 2 when the keys are absent.
  d.bos = id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  d.eos = id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  d.unk = id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  d.eot = id("tokenizer.ggml.eot_token_id", -1);
  d.pad = id("tokenizer.ggml.padding_token_id", -1);
  d.add_bos = g.has("tokenizer.ggml.add_bos_token") ? g.get_bool("tokenizer.ggml.add_bos_token") : spm;
  if (d.add_bos && d.bos < 0) d.add_bos = false;
  d.add_space_prefix = g.has("tokenizer.ggml.add_space_prefix") ? g.get_bool("tokenizer.ggml.add_space_prefix") : spm;
  d.chat_template = g.get_string_or("tokenizer.chat_template", "");
  return d;
}

Tokenizer tokenizer_from_gguf(const GGUFFile& g) {
  try {
    return Tokenizer(tokenizer_data_from_gguf(g));
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(g.path(), 0) == 0) throw;
    VQ_FAIL("{}: {}", g.path(), e.what());
  }
}

std::string model_chat_template(const GGUFFile& gguf) {
  const std::string src = gguf.get_string_or("tokenizer.chat_template", "");
  if (!src.empty() || !gguf.has("tokenizer.ggml.tokens")) return src;
  const auto tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  return chat_template_or_vocab_marker(src, std::find(tokens.begin(), tokens.end(), kGemmaTurnMarker) != tokens.end());
}

std::string apply_chat_template(const GGUFFile& gguf, const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  const std::string src = model_chat_template(gguf);
  std::string bos, eos;
  if (gguf.has("tokenizer.ggml.tokens")) {
    const auto tokens = gguf.get_string_array("tokenizer.ggml.tokens");
    const int64_t b = gguf.get_int_or("tokenizer.ggml.bos_token_id", -1);
    const int64_t e = gguf.get_int_or("tokenizer.ggml.eos_token_id", -1);
    if (b >= 0 && b < static_cast<int64_t>(tokens.size())) bos = tokens[static_cast<size_t>(b)];
    if (e >= 0 && e < static_cast<int64_t>(tokens.size())) eos = tokens[static_cast<size_t>(e)];
  }
  return format_chat(parse_chat_template(src, bos, eos), msgs, add_generation_prompt);
}

}  // namespace vq
