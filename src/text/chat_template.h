#pragma once
// Chat prompt formatting for the common instruct formats, chosen from the contents of the GGUF's
// tokenizer.chat_template (Jinja source: recognised by its markers, never executed).
//   ChatML:  <|im_start|>role\ncontent<|im_end|>\n ... [<|im_start|>assistant\n]   (SmolLM2, Qwen2/2.5/3)
//   Llama3:  <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ...     (Llama 3.x, Falcon3-like)
//   Llama2:  [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] ... (Llama 2, Mistral)
//   Zephyr:  <|system|>\nsys</s>\n<|user|>\ncontent</s>\n<|assistant|>\n             (TinyLlama-Chat v1.0)
//   Gemma:   <start_of_turn>user\n[sys\n\n]content<end_of_turn>\n<start_of_turn>model\n (Gemma 2/3; the
//            system text prefixes the first user turn, "assistant" is written "model")
// Detection order: <|im_start|>, <|start_header_id|>, [INST], <|user|>, <start_of_turn>. Unknown or
// absent template: ChatML (documented choice: the most widespread format, used by the default
// model), except that a GGUF without a template whose vocabulary has <start_of_turn> (Gemma
// files converted without one, like the Gemma 3 270M of the tests) gets the Gemma format.
// ChatML templates that insert a default system turn when none is given (SmolLM2, Qwen2.5) have
// that text extracted from the template and inserted the same way.
// The leading BOS is never written: the caller encodes the prompt with the tokenizer's add_bos
// default (later BOS/EOS of Llama2/Zephyr turns are written as text and parsed as special tokens).
// Not reproduced: Llama 3.1's "Cutting Knowledge Date" system preamble and tool-calling sections.
#include <string>
#include <vector>

namespace vq {

class Tokenizer;

struct ChatMessage {
  std::string role, content;  // role: "system", "user" or "assistant" (ChatML/Llama3 accept any)
};

enum class ChatFormat { ChatML, Llama3, Llama2, Zephyr, Gemma };

struct ChatTemplate {
  ChatFormat format = ChatFormat::ChatML;
  std::string default_system;   // ChatML: system turn inserted when the first message is not one
  std::string bos_text = "<s>";  // Llama2 turn separators
  std::string eos_text = "</s>";  // Llama2/Zephyr end of turn
};

ChatFormat detect_chat_format(const std::string& template_source);
// The template source to detect: `source`, or for an empty one when the vocabulary has
// <start_of_turn> (a template-less Gemma file), that marker (so detection gives Gemma).
std::string chat_template_or_vocab_marker(const std::string& source, bool vocab_has_start_of_turn);
inline constexpr const char* kGemmaTurnMarker = "<start_of_turn>";
const char* chat_format_name(ChatFormat f);
ChatTemplate parse_chat_template(const std::string& template_source, const std::string& bos_text = "<s>",
                                 const std::string& eos_text = "</s>");
std::string format_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// From the tokenizer: its chat_template and the BOS/EOS token texts (from a GGUF file's metadata
// without a tokenizer: model/text_gguf.h).
std::string apply_chat_template(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);

}  // namespace vq
