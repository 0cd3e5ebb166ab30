#include "core/text_escape.h"

#include <fmt/format.h>

namespace vq {

namespace {
// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 when it is not one (overlong forms,
// surrogates and values past U+10FFFF are invalid, as in RFC 3629).
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n;
  unsigned cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  return n;
}
}  // namespace

std::string escape_control(std::string_view s, bool keep_layout) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_length(s, i);
    if (n == 0) {  // not UTF-8: a raw byte a legacy terminal might read as C1 (0x9b = CSI)
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else if (n == 1 && (c < 0x20 || c == 0x7F)) {
      if (keep_layout && (c == '\n' || c == '\t')) out += char(c);
      else out += fmt::format("\\x{:02x}", c);
      ++i;
    } else if (n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0) {  // U+0080..U+009F
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(s[i + 1]));
      i += 2;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string StreamEscaper::push(std::string_view piece) {
  pending_.append(piece);
  // Back over at most 3 continuation bytes to the last lead byte; hold it back when its sequence
  // is not complete yet.
  size_t cut = pending_.size();
  for (size_t k = 1; k <= 4 && k <= pending_.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(pending_[pending_.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > k && c >= 0xC0) cut = pending_.size() - k;
    break;
  }
  std::string out = escape_control(std::string_view(pending_).substr(0, cut), true);
  pending_.erase(0, cut);
  return out;
}

std::string StreamEscaper::flush() {
  std::string out = escape_control(pending_, true);
  pending_.clear();
  return out;
}

}  // namespace vq
