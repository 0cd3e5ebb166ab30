#pragma once
#include <fmt/format.h>

#include "veloxquant/status.h"

// VQ_CHECK(cond, "format {}", args...): throws vq::Error with the formatted message.
#define VQ_CHECK(cond, ...)                                 \
  do {                                                      \
    if (!(cond)) throw ::vq::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

#define VQ_FAIL(...) throw ::vq::Error(::fmt::format(__VA_ARGS__))
