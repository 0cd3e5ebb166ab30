#pragma once
// TextStream: generated tokens -> text that is safe to send, one token at a time.
//   - A token's piece may end inside a UTF-8 character (byte-level BPE splits characters across
//     tokens): bytes are held until the character is complete; bytes that can never form one
//     become U+FFFD, so every emitted string is valid UTF-8.
//   - Stop strings may span tokens: text that could still be the start of a stop string is held
//     until it cannot; when one appears, the text before it is emitted and stopped() turns true.
//     The stop string itself is never emitted.
#include <cstdint>
#include <string>
#include <vector>

namespace vq {

class Tokenizer;

// Appends the valid UTF-8 prefix of `bytes` to out and erases it from bytes, replacing invalid
// sequences by U+FFFD; keeps a trailing incomplete character unless `flush`.
void take_utf8(std::string& bytes, std::string& out, bool flush);

class TextStream {
 public:
  // stops: non-empty strings. tok: pieces without special tokens' text.
  TextStream(const Tokenizer& tok, std::vector<std::string> stops);
  // Adds a token's text; returns what can be emitted now (maybe empty).
  std::string push(int32_t token);
  std::string push_bytes(const std::string& bytes);
  // At the end: everything still held (when no stop string was found).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::string release();  // emits text_ except a suffix that may start a stop string
  const Tokenizer& tok_;
  std::vector<std::string> stops_;
  std::string bytes_;  // not yet valid UTF-8
  std::string text_;   // valid UTF-8 not yet emitted
  bool stopped_ = false;
};

}  // namespace vq
