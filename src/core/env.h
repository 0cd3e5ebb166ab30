#pragma once
// Environment variables: every one the library and tools read is declared once in env_vars()
// (env.cpp) with its values, default and effect; docs/ENVIRONMENT.md is generated from that table
// (env_doc_markdown(); tests/core/test_env.cpp fails when the doc is stale, and a test checks
// that every variable named in src/ and tools/ is declared).
//
// CPU and GPU tuning knobs live in one options struct each, CpuTuning and GpuTuning, whose zero / automatic defaults leave
// the choice to the kernel dispatchers; the VQ_* variables only override it, read once at first
// use (never in a hot path).
#include <initializer_list>
#include <string>
#include <vector>

namespace vq {

// The variable's value; "" when it is unset or empty.
std::string env_or_empty(const char* name);
// True when the variable is exactly "0": a default-on switch turned off.
bool env_switched_off(const char* name);
// A variant choice: unset or empty gives `unset`, one of `allowed` gives that value; anything else
// throws vq::Error naming the variable, its value and the allowed ones.
int env_choice(const char* name, std::initializer_list<int> allowed, int unset);
// An integer in [lo, hi]: unset or empty gives `unset`; anything else throws vq::Error naming the
// variable and the range.
int env_int_in(const char* name, int lo, int hi, int unset);

// One declared variable. values: what it may hold; fallback: what unset means.
struct EnvVar {
  const char* name;
  const char* values;
  const char* fallback;
  const char* read_by;  // the file that reads it
  const char* effect;
};
const std::vector<EnvVar>& env_vars();
// The declaration of a variable (throws naming it when it is not declared).
const EnvVar& env_var(const char* name);
// docs/ENVIRONMENT.md: the table of env_vars().
std::string env_doc_markdown();

// CPU tuning: defaults chosen per machine where measurements differ; every field has one VQ_*
// override.
struct CpuTuning {
  // VQ_CPU_WEIGHT_PREFETCH: the one-row (decode) weight products request their weight stream a
  // few chunks ahead in software (products of 2+ rows always do). Default: off for AMD CPUs with
  // AVX-512 (Zen 4 and later), on for others. Measured (docs/BENCHMARKS.md, issue 22): Intel Xeon
  // (Emerald Rapids, 2 vCPUs) Qwen2.5-1.5B's q4_K/q6_K layer 6.6 -> 11.9 GB/s per thread; AMD
  // Zen 4 q6_K 59-72 -> 33-40 GFLOP/s (worse); AMD Zen 3 (EPYC, 2 vCPUs, no AVX-512)
  // Qwen2.5-1.5B decode 14.6-17.5 -> 26.1-28.8 tokens/s.
  bool weight_prefetch = true;
};
// The defaults for this CPU with the environment's overrides, read now (throws naming a bad value).
CpuTuning read_cpu_tuning();
// read_cpu_tuning() once per process.
const CpuTuning& cpu_tuning();

// GPU tuning: defaults let the dispatcher choose; every field has one VQ_* override.
struct GpuTuning {
  bool pdl = true;             // VQ_PDL: programmatic dependent launch between kernels of a step
  bool attn_fork = true;       // VQ_ATTN_FORK: a coded layer's dense kernel on a second stream
  bool gemv_f16 = true;        // VQ_GEMV_F16: fp16 GEMV for projections of up to 4 rows
  bool prefill_kernel = true;  // VQ_PREFILL_KERNEL: the tiled prefill attention kernel
  int prefill_warps = 0;       // VQ_PREFILL_WARPS: warps per prefill tile, 0 = the dispatcher's choice
  int prefill_keys = 0;        // VQ_PREFILL_KEYS: keys per prefill pass, 0 = the dispatcher's choice
  bool prefill_wgmma = true;   // VQ_PREFILL_WGMMA: the prefill kernel's Hopper wgmma form where built
  int prefill_ws = 1;          // VQ_PREFILL_WS: its warp-specialised form (fp16 layers, coded ones with the step's
                               // decoded past): 0 off, 1 on, 2 on with S of a pass overlapping the previous P V
  bool coded_gather_mma = false;  // VQ_CODED_ATTN_KERNEL=gather_mma: force the gather-mma split kernel
  int prefill_scratch_mib = 1024;  // VQ_PREFILL_SCRATCH_MIB: coded prefill with the past decoded once per step
                                   // into a scratch of at most this many MiB (0: each tile decodes)
};
// The defaults with the environment's overrides, read now (throws naming a bad value).
GpuTuning read_gpu_tuning();
// read_gpu_tuning() once per process.
const GpuTuning& gpu_tuning();

}  // namespace vq
