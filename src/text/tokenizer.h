#pragma once
// Tokenizers of llama-family models, built from plain data (TokenizerData; from a GGUF file's
// tokenizer.ggml.* metadata: model/text_gguf.h):
//   - "gpt2":  byte-level BPE (bytes mapped to printable code points, merges applied by rank) after a
//              model-specific pre-tokenizer split (gpt2 default, "llama-bpe"/Llama 3, "qwen2",
//              "smollm"), implemented as hand-written scanners (tokenizer_pretok.cpp).
//   - "llama": SentencePiece-style (Llama 2, TinyLlama): spaces become U+2581, an optional dummy
//              prefix space, pieces merged by score, bytes without a piece fall back to <0xXX>.
// Special tokens are matched literally in the text: user-defined ones always, control and unknown
// ones when parse_special is true (longest match first).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vq {

// Token types as stored in tokenizer.ggml.token_type (SentencePiece numbering).
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

struct TokenizerData {
  std::string model = "gpt2";           // "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre = "default";          // pre-tokenizer name (tokenizer.ggml.pre)
  std::vector<std::string> tokens;      // [n_vocab] token text (byte-level BPE: mapped code points)
  std::vector<float> scores;            // [n_vocab] or empty (SentencePiece merge priority)
  std::vector<int32_t> token_types;     // [n_vocab] TokenType values, or empty (all Normal)
  std::vector<std::string> merges;      // BPE merges "left right", rank = index; empty for "llama"
  int32_t bos = -1, eos = -1, eot = -1, pad = -1, unk = -1;  // -1: absent
  bool add_bos = false;                 // tokenizer.ggml.add_bos_token
  bool add_space_prefix = true;         // SentencePiece dummy prefix (tokenizer.ggml.add_space_prefix)
  std::string chat_template;            // tokenizer.chat_template (Jinja source) or ""
};

class Tokenizer {
 public:
  // Throws vq::Error naming the field when the data is inconsistent (sizes, ids out of range,
  // unknown model, a merge naming an unknown token).
  explicit Tokenizer(const TokenizerData& data);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const;
  // special = false: control/unknown/unused tokens contribute nothing; true: their text.
  // SentencePiece: the dummy-prefix space of the first text token is dropped.
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;
  // The bytes this token contributes (for streaming; may be partial UTF-8). SentencePiece pieces
  // keep their leading space. Throws for an id outside the vocabulary.
  std::string piece(int32_t id, bool special = false) const;
  const std::string& token_text(int32_t id) const;  // the vocabulary string as stored

  int32_t bos() const;
  int32_t eos() const;
  int32_t eot() const;                  // -1 when absent
  bool is_eog(int32_t id) const;        // end of generation: eos, eot, and known end tokens
  bool is_control(int32_t id) const;
  int n_vocab() const;
  bool add_bos_default() const;
  const std::string& model() const;     // "gpt2" or "llama"
  const std::string& pre() const;
  int32_t find_token(std::string_view text) const;  // exact vocabulary string -> id, or -1
  const std::string& chat_template() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vq
