#pragma once
// Environment variables read by the library and tools: the cache folder's, and the default-on
// switches that turn a GPU path off for comparisons (VQ_PDL=0, VQ_ATTN_FORK=0, VQ_GEMV_F16=0,
// VQ_PREFILL_KERNEL=0; docs/CUDA_NOTES.md), and the variant choices measured against each other
// (VQ_PREFILL_WARPS=4|8, VQ_PREFILL_KEYS=32|64).
#include <initializer_list>
#include <string>

namespace vq {

// The variable's value; "" when it is unset or empty.
std::string env_or_empty(const char* name);
// True when the variable is exactly "0": a default-on switch turned off.
bool env_switched_off(const char* name);
// A variant choice: unset or empty gives `unset`, one of `allowed` gives that value; anything else
// throws vq::Error naming the variable, its value and the allowed ones.
int env_choice(const char* name, std::initializer_list<int> allowed, int unset);

}  // namespace vq
