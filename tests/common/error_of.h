#pragma once
// The message of the vq::Error that f() throws, or "" when it throws none (tests that check
// what an error says).
#include <string>

#include "veloxquant/status.h"

namespace vq::test {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace vq::test
