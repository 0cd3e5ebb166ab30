#include "text/chat_template.h"

#include <algorithm>

#include "text/tokenizer.h"

namespace vq {

namespace {

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// A default system prompt written literally in a ChatML template:
// '<|im_start|>system\n<text><|im_end|>' with <text> free of template syntax.
std::string chatml_default_system(const std::string& src) {
  const std::string open = "<|im_start|>system";
  for (size_t at = src.find(open); at != std::string::npos; at = src.find(open, at + 1)) {
    size_t p = at + open.size();
    if (src.compare(p, 1, "\n") == 0) p += 1;
    else if (src.compare(p, 2, "\\n") == 0) p += 2;
    else continue;
    const size_t end = src.find("<|im_end|>", p);
    if (end == std::string::npos) break;
    const std::string text = src.substr(p, end - p);
    if (text.empty() || text.find_first_of("{}'\"+\\") != std::string::npos) continue;
    return text;
  }
  return {};
}

}  // namespace

ChatFormat detect_chat_format(const std::string& src) {
  if (contains(src, "<|im_start|>")) return ChatFormat::ChatML;
  if (contains(src, "<|start_header_id|>")) return ChatFormat::Llama3;
  if (contains(src, "[INST]")) return ChatFormat::Llama2;
  if (contains(src, "<|user|>") && contains(src, "<|assistant|>")) return ChatFormat::Zephyr;
  if (contains(src, "<start_of_turn>")) return ChatFormat::Gemma;
  return ChatFormat::ChatML;
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::Llama2: return "llama2";
    case ChatFormat::Zephyr: return "zephyr";
    case ChatFormat::Gemma: return "gemma";
  }
  return "?";
}

ChatTemplate parse_chat_template(const std::string& src, const std::string& bos_text, const std::string& eos_text) {
  ChatTemplate t;
  t.format = detect_chat_format(src);
  if (t.format == ChatFormat::ChatML) t.default_system = chatml_default_system(src);
  if (!bos_text.empty()) t.bos_text = bos_text;
  if (!eos_text.empty()) t.eos_text = eos_text;
  return t;
}

std::string format_chat(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  std::string out;
  switch (t.format) {
    case ChatFormat::ChatML: {
      if (!t.default_system.empty() && (msgs.empty() || msgs[0].role != "system"))
        out += "<|im_start|>system\n" + t.default_system + "<|im_end|>\n";
      for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    }
    case ChatFormat::Llama3: {
      for (const auto& m : msgs)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatFormat::Llama2: {
      // System messages go into a <<SYS>> block at the start of the next user turn. Every user
      // turn after the first starts with the BOS text; an assistant turn ends with the EOS text.
      std::string system;
      bool first_user = true;
      for (const auto& m : msgs) {
        if (m.role == "system") {
          if (!system.empty()) system.push_back('\n');
          system.append(trim(m.content));
        } else if (m.role == "assistant") {
          out.push_back(' ');
          out.append(trim(m.content));
          out.push_back(' ');
          out.append(t.eos_text);
        } else {
          std::string content = trim(m.content);
          if (!system.empty()) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
          system.clear();
          if (!first_user) out += t.bos_text;
          out += "[INST] " + content + " [/INST]";
          first_user = false;
        }
      }
      break;  // the answer follows "[/INST]" directly: no generation prompt to add
    }
    case ChatFormat::Zephyr: {
      for (const auto& m : msgs) out += "<|" + m.role + "|>\n" + m.content + t.eos_text + "\n";
      if (add_generation_prompt) out += "<|assistant|>\n";
      break;
    }
    case ChatFormat::Gemma: {
      // No system role: a leading system message becomes a prefix of the first turn.
      size_t i = 0;
      std::string prefix;
      if (!msgs.empty() && msgs[0].role == "system") prefix = msgs[i++].content + "\n\n";
      for (; i < msgs.size(); ++i) {
        const std::string role = msgs[i].role == "assistant" ? "model" : msgs[i].role;
        out += "<start_of_turn>" + role + "\n" + prefix + trim(msgs[i].content) + "<end_of_turn>\n";
        prefix.clear();
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }
  }
  return out;
}

std::string chat_template_or_vocab_marker(const std::string& src, bool vocab_has_turn) {
  return src.empty() && vocab_has_turn ? std::string(kGemmaTurnMarker) : src;
}

std::string apply_chat_template(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  const std::string bos = tok.bos() >= 0 ? tok.token_text(tok.bos()) : std::string();
  const std::string eos = tok.eos() >= 0 ? tok.token_text(tok.eos()) : std::string();
  const std::string src = chat_template_or_vocab_marker(tok.chat_template(), tok.find_token(kGemmaTurnMarker) >= 0);
  return format_chat(parse_chat_template(src, bos, eos), msgs, add_generation_prompt);
}

}  // namespace vq
