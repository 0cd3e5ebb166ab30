#pragma once
// Internal to src/ops/cuda: programmatic dependent launch (PDL, sm_90) for the kernels of the
// forward chain. A kernel launched with launch_pdl may start while the previous kernel in the
// stream is still running (its blocks are scheduled once every block of the previous grid has
// called pdl_trigger or exited), so the launch latency and the ramp of each small kernel hide
// behind its predecessor's tail. The rule that keeps this correct: a kernel launched with
// launch_pdl calls pdl_wait() before it reads anything an earlier kernel wrote and before it
// writes anything (pdl_wait returns once the previous grid has completed and its writes are
// visible; with no programmatic predecessor it returns at once). Reads of data no kernel of
// the step writes (weights) may come before it: gemv_f16 prefetches its first weights there.
// VQ_PDL=0 turns the attribute off (plain stream order), for comparisons.
#include <cuda_runtime.h>

#include <utility>

#include "ops/cuda/cuda_check.cuh"

namespace vq::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether launch_pdl sets the attribute (VQ_PDL unset or not "0"; read once).
bool pdl_enabled();

// Launches `kernel` with the PDL attribute when `pdl` (and pdl_enabled()), else in plain stream
// order; throws naming `name` when the launch fails.
template <typename... KArgs, typename... Args>
void launch_kernel(const char* name, bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t st, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && pdl_enabled() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) VQ_FAIL("CUDA: kernel {} failed to launch: {}", name, cudaGetErrorString(e));
}

template <typename... KArgs, typename... Args>
void launch_pdl(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                Args&&... args) {
  launch_kernel(name, true, kernel, grid, block, smem, st, std::forward<Args>(args)...);
}

}  // namespace vq::cuda
