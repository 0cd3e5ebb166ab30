#include "core/env.h"

#include <cstdlib>

namespace vq {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string();
}

bool env_switched_off(const char* name) { return env_or_empty(name) == "0"; }

}  // namespace vq
