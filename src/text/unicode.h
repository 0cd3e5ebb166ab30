#pragma once
// Minimal Unicode support for the tokenizer: UTF-8 decoding/encoding and the character classes the
// pre-tokenizer split patterns use: \p{L} (general category L*), \p{N} (N*), \s (White_Space).
// Coverage: the full Unicode Character Database 14.0 for L and N (unicode_tables.cpp, generated
// offline by unicode_gen.py); White_Space is the 25 code points of PropList.txt. Case folding is
// ASCII-only (used for the (?i:'s|'t|...) contractions).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace vq::unicode {

struct CodepointRange { uint32_t first, last; };  // inclusive

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// Decodes the code point starting at s[i]; *len receives its byte length (1..4). An invalid,
// overlong or truncated sequence decodes as its first byte alone, with the out-of-range value
// 0x110000 + byte (class kOther), so every byte of the input is covered exactly once.
uint32_t decode_utf8(std::string_view s, size_t i, int* len);
void append_utf8(std::string& out, uint32_t cp);
int utf8_len(uint8_t lead);  // 1..4 from the lead byte (1 for continuation/invalid bytes)

CharClass char_class(uint32_t cp);
inline bool is_letter(uint32_t cp) { return char_class(cp) == kLetter; }
inline bool is_number(uint32_t cp) { return char_class(cp) == kNumber; }
inline bool is_space(uint32_t cp) { return char_class(cp) == kSpace; }

}  // namespace vq::unicode
