// How many L2 -> SM sectors a warp's 16-byte cp.async copies cost, by copy form (issue 21: ncu showed
// 32 sectors per 512-byte LDGSTS in the prefill kernels). Each block streams `iters` chunks of
// 64 KiB from a buffer (argument, MiB) into shared memory. Run under ncu with
//   --metrics l1tex__m_xbar2l1tex_read_sectors_mem_lg_op_ld.sum,smsp__inst_executed_op_ldgsts.sum,gpu__time_duration.sum
// Built by bench/cuda/CMakeLists.txt; run: ldgsts_sectors [buffer MiB] (8: L2-resident, 64: from memory).
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>

__device__ __forceinline__ uint32_t su32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

template <int MODE>
__global__ void __launch_bounds__(128) copy_kernel(const uint4* __restrict__ src, size_t n16, int iters, int* sink) {
  extern __shared__ uint4 sm[];  // 64 KiB
  const int tid = threadIdx.x;
  size_t base = (size_t(blockIdx.x) * 4096) % n16;
  for (int it = 0; it < iters; ++it) {
    const uint4* s = src + (base + size_t(it) * 4096 * gridDim.x) % n16;
    for (int i = tid; i < 4096; i += 128) {
      if constexpr (MODE == 0) {  // cp.async.cg 16 with a register src-size (the kernels' form)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(su32(sm + i)), "l"(s + i), "r"(16) : "memory");
      } else if constexpr (MODE == 1) {  // cp.async.cg 16, no src-size
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(su32(sm + i)), "l"(s + i) : "memory");
      } else if constexpr (MODE == 2) {  // cp.async.ca 16
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(su32(sm + i)), "l"(s + i) : "memory");
      } else if constexpr (MODE == 3) {  // cp.async.cg 16 with an L2 256-byte prefetch hint
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(su32(sm + i)), "l"(s + i) : "memory");
      } else if constexpr (MODE == 4) {  // plain 16-byte load + shared store
        sm[i] = __ldcg(s + i);
      } else {
        // 5: the prefill kernels' no-swizzle core-matrix pattern: lane l of a warp writes slot
        //    (l % 4) * 8 + l / 4, so the two halves of a global sector land 128 bytes apart;
        // 6: each sector's halves swapped (slot i ^ 1), 7: pairs kept, pairs permuted (slot i ^ 2).
        const int l = i & 31, w = i & ~31;
        const int slot = MODE == 5 ? w + (l % 4) * 8 + l / 4 : MODE == 6 ? (i ^ 1) : (i ^ 2);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(su32(sm + slot)), "l"(s + i) : "memory");
      }
    }
    if constexpr (MODE != 4) asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
  }
  if (tid == 0 && sm[5].x == 12345u) *sink = 1;
}

template <int MODE>
void run(const uint4* src, size_t n16, int* sink, const char* name) {
  cudaFuncSetAttribute(copy_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  const int grid = 132, iters = 256;
  copy_kernel<MODE><<<grid, 128, 65536>>>(src, n16, iters, sink);
  cudaEventRecord(a);
  copy_kernel<MODE><<<grid, 128, 65536>>>(src, n16, iters, sink);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  const double bytes = double(grid) * iters * 65536;
  printf("ldgsts buf=%zu MiB mode=%d %-28s %.3f ms %.2f TB/s (%s)\n", n16 * 16 >> 20, MODE, name, ms, bytes / ms / 1e9, cudaGetErrorString(cudaGetLastError()));
}

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? size_t(atoi(argv[1])) : 64;  // buffer: 64 MiB streams from memory, 8 stays in L2
  const size_t n16 = (mib << 20) / 16;
  uint4* src;
  int* sink;
  cudaMalloc(&src, n16 * 16);
  cudaMalloc(&sink, 4);
  cudaMemset(src, 1, n16 * 16);
  run<0>(src, n16, sink, "cg16 src-size reg");
  run<1>(src, n16, sink, "cg16");
  run<2>(src, n16, sink, "ca16");
  run<3>(src, n16, sink, "cg16 L2::256B");
  run<4>(src, n16, sink, "ld.cg + st.shared");
  run<5>(src, n16, sink, "cg16 core-matrix dst");
  run<6>(src, n16, sink, "cg16 sector halves swapped");
  run<7>(src, n16, sink, "cg16 sector pairs permuted");
  return 0;
}
