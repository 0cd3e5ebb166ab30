#include "core/int_list.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/text_escape.h"

namespace vq {

int64_t parse_int_option(std::string_view text, std::string_view what, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (!text.empty() && ec == std::errc() && ptr == end && v >= lo && v <= hi) return v;
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const std::string want = lo == 1 ? (hi == kNone ? std::string("a positive integer") : fmt::format("a positive integer up to {}", hi))
                           : hi == kNone ? fmt::format("an integer >= {}", lo)
                                         : fmt::format("an integer in {}..{}", lo, hi);
  VQ_FAIL("{}: '{}' is not {}", what, escape_control(text), want);
}

std::vector<int64_t> parse_int_list(std::string_view text, std::string_view what, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    const std::string_view item = text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    VQ_CHECK(!item.empty(), "{}: '{}' has an empty item (give a list like 1,4,8)", what, escape_control(text));
    out.push_back(parse_int_option(item, what, lo, hi));
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace vq
