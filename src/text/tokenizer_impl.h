#pragma once
// Private state of vq::Tokenizer shared by tokenizer.cpp (construction, special tokens, decode),
// tokenizer_bpe.cpp (byte-level BPE) and tokenizer_spm.cpp (SentencePiece-style).
#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"
#include "text/tokenizer_pretok.h"

namespace vq {

struct Tokenizer::Impl {
  TokenizerData d;                 // tokens/scores/types as given (types filled to n_vocab)
  bool spm = false;                // "llama" model
  detail::PreTokKind pretok = detail::PreTokKind::Gpt2;
  bool ignore_merges = false;      // Llama 3: a whole pre-token found in the vocabulary is one token

  std::unordered_map<std::string_view, int32_t> text_to_id;  // views into d.tokens
  std::vector<std::string> pieces;     // [n_vocab] decoded bytes of each token (control: its text)

  // Byte-level BPE.
  struct Merge { int32_t rank, merged; };
  std::unordered_map<uint64_t, Merge> merges;  // key (left id << 32 | right id)
  std::array<int32_t, 256> byte_token{};       // id of the one-byte token of each byte, -1 if none
  std::array<std::string, 256> byte_char;      // UTF-8 of the printable code point of each byte

  // SentencePiece.
  std::array<int32_t, 256> byte_fallback{};    // id of <0xXX>, -1 if none

  // Special tokens matched in the text, longest first, bucketed by first byte.
  std::array<std::vector<int32_t>, 256> special_by_byte;
  std::vector<uint8_t> eog;                    // [n_vocab] 1 for end-of-generation tokens

  TokenType type(int32_t id) const { return static_cast<TokenType>(d.token_types[static_cast<size_t>(id)]); }
  int32_t lookup(std::string_view s) const {
    auto it = text_to_id.find(s);
    return it == text_to_id.end() ? -1 : it->second;
  }
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
  void encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;
};

// The GPT-2 byte-to-code-point map: printable bytes map to themselves, the other 68 to 256+n.
uint32_t byte_to_codepoint(uint8_t b);
int codepoint_to_byte(uint32_t cp);  // -1 when cp is not the image of a byte

}  // namespace vq
