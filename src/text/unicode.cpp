#include "text/unicode.h"

#include <algorithm>
#include <array>

namespace vq::unicode {

extern const CodepointRange kLetterRanges[];
extern const size_t kLetterRanges_size;
extern const CodepointRange kNumberRanges[];
extern const size_t kNumberRanges_size;

namespace {

// Code points outside Unicode that stand for an invalid byte (never L, N or space).
constexpr uint32_t kInvalidByteBase = 0x110000;

bool in_ranges(const CodepointRange* r, size_t n, uint32_t cp) {
  const CodepointRange* end = r + n;
  const CodepointRange* it =
      std::upper_bound(r, end, cp, [](uint32_t v, const CodepointRange& x) { return v < x.first; });
  return it != r && cp <= (it - 1)->last;
}

bool is_white_space(uint32_t cp) {
  // White_Space property (PropList.txt).
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

struct AsciiTable {
  std::array<CharClass, 128> c{};
  AsciiTable() {
    for (uint32_t i = 0; i < 128; ++i) {
      if (is_white_space(i)) c[i] = kSpace;
      else if ((i >= 'a' && i <= 'z') || (i >= 'A' && i <= 'Z')) c[i] = kLetter;
      else if (i >= '0' && i <= '9') c[i] = kNumber;
      else c[i] = kOther;
    }
  }
};
const AsciiTable kAscii;

}  // namespace

int utf8_len(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

uint32_t decode_utf8(std::string_view s, size_t i, int* len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) { *len = 1; return b0; }
  const int n = utf8_len(b0);
  auto invalid = [&]() { *len = 1; return kInvalidByteBase + b0; };
  if (n == 1 || i + n > s.size()) return invalid();
  uint32_t cp = b0 & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return invalid();
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return invalid();
  *len = n;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

CharClass char_class(uint32_t cp) {
  if (cp < 128) return kAscii.c[cp];
  if (cp >= kInvalidByteBase) return kOther;
  if (is_white_space(cp)) return kSpace;
  if (in_ranges(kLetterRanges, kLetterRanges_size, cp)) return kLetter;
  if (in_ranges(kNumberRanges, kNumberRanges_size, cp)) return kNumber;
  return kOther;
}

}  // namespace vq::unicode
