#pragma once
// What the machine is, for the records benchmarks and evaluations write beside their numbers.
#include <string>

namespace vq {

// The "model name" line of /proc/cpuinfo (e.g. "AMD EPYC 9R14"); "unknown" when absent.
std::string cpu_model_name();

// The x86 CPUID vendor string ("GenuineIntel", "AuthenticAMD", ...); "" on other architectures.
std::string cpu_vendor();

// Whether CPUID reports AVX-512 Foundation (leaf 7, EBX bit 16); false on other architectures.
bool cpu_has_avx512f();

}  // namespace vq
