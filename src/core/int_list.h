#pragma once
// Integers of command-line options ("--threads 1,2,4", "--reps 20"): the whole text must be the
// number(s), each within [lo, hi]; anything else (empty items, signs where lo >= 0, trailing
// characters, overflow) throws vq::Error naming the option and the bad item, never reads as 0.
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

namespace vq {

int64_t parse_int_option(std::string_view text, std::string_view what, int64_t lo = 1,
                         int64_t hi = std::numeric_limits<int64_t>::max());
// A comma-separated list ("1,4,8"); at least one item.
std::vector<int64_t> parse_int_list(std::string_view text, std::string_view what, int64_t lo = 1,
                                    int64_t hi = std::numeric_limits<int64_t>::max());

}  // namespace vq
