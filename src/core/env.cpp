#include "core/env.h"

#include <cstdlib>

#include "core/error.h"

namespace vq {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string();
}

bool env_switched_off(const char* name) { return env_or_empty(name) == "0"; }

int env_choice(const char* name, std::initializer_list<int> allowed, int unset) {
  const std::string v = env_or_empty(name);
  if (v.empty()) return unset;
  std::string list;
  for (int a : allowed) {
    if (v == std::to_string(a)) return a;
    list += (list.empty() ? "" : " or ") + std::to_string(a);
  }
  VQ_FAIL("{}={}: must be {} (or unset)", name, v, list);
}

}  // namespace vq
