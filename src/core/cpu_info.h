#pragma once
// What the machine is, for the records benchmarks and evaluations write beside their numbers.
#include <string>

namespace vq {

// The "model name" line of /proc/cpuinfo (e.g. "AMD EPYC 9R14"); "unknown" when absent.
std::string cpu_model_name();

// The x86 CPUID vendor string ("GenuineIntel", "AuthenticAMD", ...); "" on other architectures.
std::string cpu_vendor();

}  // namespace vq
