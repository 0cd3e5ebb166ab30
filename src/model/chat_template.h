#pragma once
// Chat prompt formatting for the common instruct formats, chosen from the contents of the GGUF's
// tokenizer.chat_template (Jinja source; we only recognise it, we do not execute it).
//   ChatML:  <|im_start|>role\ncontent<|im_end|>\n ... (SmolLM2, Qwen2/2.5/3)
//   Llama3:  <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ...
//   Llama2:  [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] assistant</s><s>[INST] ... (Llama 2, TinyLlama chat v0.x, Mistral)
//   Zephyr:  <|user|>\ncontent</s>\n<|assistant|>\n (TinyLlama-1.1B-Chat-v1.0)
// Unknown or absent template: ChatML (documented choice: it is the most widespread format and its
// markers are plain text when the vocabulary lacks them). The leading BOS is never written here;
// the caller encodes the result with the tokenizer's add_bos default.
#include <string>
#include <vector>

namespace vq {

class GGUFFile;

struct ChatMessage {
  std::string role, content;  // role: "system", "user" or "assistant"
};

enum class ChatFormat { ChatML, Llama3, Llama2, Zephyr };

ChatFormat detect_chat_format(const std::string& template_source);  // "" -> ChatML
const char* chat_format_name(ChatFormat f);
std::string format_chat(ChatFormat f, const std::vector<ChatMessage>& messages, bool add_generation_prompt);
std::string apply_chat_template(const GGUFFile& gguf, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);

}  // namespace vq
