#pragma once
// The text layer's inputs from a GGUF file: the tokenizer.ggml.* metadata into TokenizerData and a
// Tokenizer (text/tokenizer.h), the chat template source and prompt formatting straight from the
// metadata (text/chat_template.h). Here, not in src/text, so that text knows nothing of GGUF.
#include <string>
#include <vector>

#include "model/gguf.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace vq {

// Throws vq::Error naming the file and the key when the metadata is missing or inconsistent.
TokenizerData tokenizer_data_from_gguf(const GGUFFile& gguf);
Tokenizer tokenizer_from_gguf(const GGUFFile& gguf);

// The file's template source, or for a template-less GGUF whose vocabulary has <start_of_turn>,
// that marker (so detection gives Gemma).
std::string model_chat_template(const GGUFFile& gguf);
// As apply_chat_template(Tokenizer, ...), reading the template and the BOS/EOS texts from the metadata.
std::string apply_chat_template(const GGUFFile& gguf, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);

}  // namespace vq
