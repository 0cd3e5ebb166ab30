#pragma once
// Process-wide settings and facts: the library version, the worker thread pool, the GPU.
#include <string>

#include "veloxquant/version.h"

namespace veloxquant {

std::string version();        // "0.1.0", the library's (compare with VELOXQUANT_VERSION, the headers')
// The process-wide pool that runs attention and matrix products (hardware threads by default).
// Not to be changed while a Session or Engine is running a step on another thread.
void set_num_threads(int n);  // n >= 1
int num_threads();
bool cuda_available();        // this build has the CUDA backend and a usable device is present

}  // namespace veloxquant
