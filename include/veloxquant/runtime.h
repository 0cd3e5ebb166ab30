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
std::string cuda_unavailable_reason();  // why cuda_available() is false ("" when it is true)
std::string cuda_device_description();
std::string cpu_description();          // the CPU's model name (/proc/cpuinfo), or "" when unknown  // "NVIDIA H200, 139 GiB, sm_90", or "" without a usable device

// Where a model runs and its KV pool lives (SessionOptions, EngineOptions, PerplexityOptions,
// CalibrationOptions). cuda needs cuda_available(); constructing with it otherwise throws.
enum class Device { cpu, cuda };
const char* device_name(Device d);  // "cpu", "cuda"
// "cpu", "cuda" or "auto" (cuda when cuda_available(), else cpu); "cuda" without a usable device
// and any other name throw vq::Error naming the reason or the accepted names.
Device parse_device(const std::string& name);

}  // namespace veloxquant
