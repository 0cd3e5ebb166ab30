#include "server/text_stream.h"

#include <algorithm>

#include "text/tokenizer.h"

namespace vq {
namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the character led by c (0: c cannot lead one), and the range its second byte must
// fall in (excludes overlong forms, surrogates and code points past U+10FFFF).
int lead_length(unsigned char c, unsigned char& lo, unsigned char& hi) {
  lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) {
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

}  // namespace

void take_utf8(std::string& bytes, std::string& out, bool flush) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    unsigned char lo, hi;
    const int len = lead_length(c, lo, hi);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // How many of the following bytes are valid continuations of this character.
    int ok = 1;
    while (ok < len && i + size_t(ok) < n) {
      const auto b = static_cast<unsigned char>(bytes[i + size_t(ok)]);
      if (ok == 1 ? (b < lo || b > hi) : !is_cont(b)) break;
      ++ok;
    }
    if (ok == len) {
      out.append(bytes, i, size_t(len));
      i += size_t(len);
    } else if (i + size_t(ok) == n && !flush) {
      break;  // incomplete so far: the next token may complete it
    } else {
      out += kReplacement;  // a broken character: its valid part is replaced as one
      i += size_t(ok);
    }
  }
  bytes.erase(0, i);
}

TextStream::TextStream(const Tokenizer& tok, std::vector<std::string> stops) : tok_(tok), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string TextStream::push(int32_t token) { return push_bytes(tok_.piece(token)); }

std::string TextStream::push_bytes(const std::string& bytes) {
  if (stopped_) return {};
  bytes_ += bytes;
  take_utf8(bytes_, text_, false);
  return release();
}

std::string TextStream::release() {
  // The earliest stop string in the held text ends the stream.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, text_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = text_.substr(0, first);
    text_.clear();
    bytes_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, text_.size()); k > hold; --k)
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = text_.substr(0, text_.size() - hold);
  text_.erase(0, text_.size() - hold);
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  take_utf8(bytes_, text_, true);
  std::string out;
  out.swap(text_);
  return out;
}

}  // namespace vq
