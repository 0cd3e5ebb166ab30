// The environment registry (core/env.h): every variable the code reads is declared, the doc
// table docs/ENVIRONMENT.md is generated from the declarations, and GpuTuning takes the
// dispatcher's defaults unless a declared variable overrides them (bad values refused).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#if defined(__GNUC__) && !defined(__clang__)
// libstdc++ 12's <regex> under the sanitizer build: -Wmaybe-uninitialized inside std::function (a
// false positive of GCC's flow analysis, not of this test).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/error_of.h"
#include "core/cpu_info.h"
#include "core/env.h"

namespace fs = std::filesystem;

namespace vq {
namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(EnvRegistry, DocIsCurrent) {
  const fs::path doc = fs::path(VQ_SOURCE_DIR) / "docs" / "ENVIRONMENT.md";
  const std::string want = env_doc_markdown();
  if (read_text(doc) != want) {
    const fs::path fresh = fs::path(VQ_BINARY_DIR) / "ENVIRONMENT.md";
    std::ofstream(fresh, std::ios::binary) << want;
    FAIL() << doc << " is stale: the declarations in src/core/env.cpp changed. Regenerate it: cp " << fresh << " "
           << doc;
  }
}

// Scans src/ and tools/ for the names passed to getenv / env_or_empty / env_choice /
// env_switched_off / env_var: each must be declared (no switch without its documentation).
TEST(EnvRegistry, EveryVariableReadIsDeclared) {
  const std::regex call(R"((getenv|env_or_empty|env_choice|env_switched_off|env_var|env_switch)\(\s*"([A-Za-z_0-9]+)\")");
  std::set<std::string> declared;
  for (const EnvVar& v : env_vars()) EXPECT_TRUE(declared.insert(v.name).second) << v.name << " declared twice";
  int found = 0;
  for (const char* dir : {"src", "tools"})
    for (const auto& e : fs::recursive_directory_iterator(fs::path(VQ_SOURCE_DIR) / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh")) continue;
      const std::string text = read_text(e.path());
      for (std::sregex_iterator it(text.begin(), text.end(), call), end; it != end; ++it) {
        ++found;
        EXPECT_TRUE(declared.count((*it)[2].str())) << (*it)[2].str() << " read in " << e.path() << " is not declared";
      }
    }
  EXPECT_GE(found, 10);
  EXPECT_NE(test::error_of([] { env_var("VQ_NOT_DECLARED"); }).find("VQ_NOT_DECLARED is not declared"),
            std::string::npos);
}

// Unset: the defaults, which leave the choices to the dispatchers (0 / on). Each variable
// overrides its field; a value outside the declared ones is one error naming the variable.
TEST(EnvRegistry, GpuTuningDefaultsAndOverrides) {
  const char* names[] = {"VQ_PDL", "VQ_ATTN_FORK", "VQ_GEMV_F16", "VQ_PREFILL_KERNEL", "VQ_PREFILL_WARPS",
                         "VQ_PREFILL_KEYS", "VQ_PREFILL_WGMMA", "VQ_CODED_ATTN_KERNEL", "VQ_PREFILL_WS",
                         "VQ_PREFILL_SCRATCH_MIB"};
  for (const char* n : names) unsetenv(n);
  GpuTuning t = read_gpu_tuning();
  EXPECT_TRUE(t.pdl && t.attn_fork && t.gemv_f16 && t.prefill_kernel && t.prefill_wgmma);
  EXPECT_EQ(t.prefill_warps, 0);
  EXPECT_EQ(t.prefill_keys, 0);
  EXPECT_FALSE(t.coded_gather_mma);
  EXPECT_EQ(t.prefill_ws, 1);
  EXPECT_EQ(t.prefill_scratch_mib, 1024);
  setenv("VQ_PDL", "0", 1);
  setenv("VQ_PREFILL_WS", "2", 1);
  setenv("VQ_PREFILL_SCRATCH_MIB", "0", 1);
  setenv("VQ_PREFILL_WARPS", "8", 1);
  setenv("VQ_PREFILL_KEYS", "32", 1);
  setenv("VQ_PREFILL_WGMMA", "0", 1);
  setenv("VQ_CODED_ATTN_KERNEL", "gather_mma", 1);
  t = read_gpu_tuning();
  EXPECT_FALSE(t.prefill_wgmma);
  EXPECT_FALSE(t.pdl);
  EXPECT_TRUE(t.attn_fork);
  EXPECT_EQ(t.prefill_warps, 8);
  EXPECT_EQ(t.prefill_keys, 32);
  EXPECT_TRUE(t.coded_gather_mma);
  EXPECT_EQ(t.prefill_ws, 2);
  EXPECT_EQ(t.prefill_scratch_mib, 0);
  for (auto [name, bad] : {std::pair{"VQ_PDL", "off"}, {"VQ_PREFILL_WARPS", "6"}, {"VQ_PREFILL_WGMMA", "2"},
                                {"VQ_CODED_ATTN_KERNEL", "fast"}, {"VQ_PREFILL_WS", "3"},
                                {"VQ_PREFILL_SCRATCH_MIB", "-1"}, {"VQ_PREFILL_SCRATCH_MIB", "1x"},
                                {"VQ_PREFILL_SCRATCH_MIB", "70000"}}) {
    setenv(name, bad, 1);
    const std::string e = test::error_of([] { read_gpu_tuning(); });
    EXPECT_NE(e.find(std::string(name) + "=" + bad), std::string::npos) << e;
    unsetenv(name);
  }
  for (const char* n : names) unsetenv(n);
}

// CpuTuning: the weight prefetch defaults by the CPU (off on AMD with AVX-512, Zen 4 and later);
// VQ_CPU_WEIGHT_PREFETCH overrides it either way; a bad value is one error naming the variable.
TEST(EnvRegistry, CpuTuningDefaultsAndOverrides) {
  unsetenv("VQ_CPU_WEIGHT_PREFETCH");
  EXPECT_EQ(read_cpu_tuning().weight_prefetch, !(cpu_vendor() == "AuthenticAMD" && cpu_has_avx512f()))
      << "vendor " << cpu_vendor() << ", avx512f " << cpu_has_avx512f();
  setenv("VQ_CPU_WEIGHT_PREFETCH", "0", 1);
  EXPECT_FALSE(read_cpu_tuning().weight_prefetch);
  setenv("VQ_CPU_WEIGHT_PREFETCH", "1", 1);
  EXPECT_TRUE(read_cpu_tuning().weight_prefetch);
  setenv("VQ_CPU_WEIGHT_PREFETCH", "yes", 1);
  const std::string e = test::error_of([] { read_cpu_tuning(); });
  EXPECT_NE(e.find("VQ_CPU_WEIGHT_PREFETCH=yes"), std::string::npos) << e;
  unsetenv("VQ_CPU_WEIGHT_PREFETCH");
}

// The vendor string is CPUID's 12 characters on x86 (empty elsewhere).
TEST(CpuInfo, VendorIsCpuidsString) {
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_EQ(cpu_vendor().size(), 12u) << cpu_vendor();
#else
  EXPECT_EQ(cpu_vendor(), "");
#endif
}

// AVX-512 Foundation as CPUID reports it agrees with the kernel's flags in /proc/cpuinfo.
TEST(CpuInfo, Avx512fAgreesWithProcCpuinfo) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  bool found = false, flag = false;
  while (!found && std::getline(f, line))
    if (line.rfind("flags", 0) == 0) found = true, flag = (line + " ").find(" avx512f ") != std::string::npos;
  if (!found) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  EXPECT_EQ(cpu_has_avx512f(), flag);
#else
  EXPECT_FALSE(cpu_has_avx512f());
#endif
}

}  // namespace
}  // namespace vq
