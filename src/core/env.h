#pragma once
// Environment variables read by the library and tools: the cache folder's, and the default-on
// switches that turn a GPU path off for comparisons (VQ_PDL=0, VQ_ATTN_FORK=0, VQ_GEMV_F16=0,
// VQ_PREFILL_KERNEL=0; docs/CUDA_NOTES.md).
#include <string>

namespace vq {

// The variable's value; "" when it is unset or empty.
std::string env_or_empty(const char* name);
// True when the variable is exactly "0": a default-on switch turned off.
bool env_switched_off(const char* name);

}  // namespace vq
