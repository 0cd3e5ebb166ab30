// Device data paths of the KV pool and small row ops of the device forward (kv_blocks_cuda.h).
// The block encoder is in pq_encode.cu (it reuses the fused encoder's kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/hadamard.cuh"
#include "ops/cuda/kv_blocks_cuda.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/scalar_blocks.cuh"
#include "ops/cuda/smem_attr.cuh"

namespace vq::cuda {
namespace {

// Grid (rows, n_kv_heads); threads over the head's channels.
__global__ void kv_append_kernel(KVAppendParams p) {
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int r = blockIdx.x, h = blockIdx.y;
  const int H = p.n_kv_heads, D = p.head_dim, B = p.block_tokens;
  const int64_t t = p.pos[r];
  uint8_t* blk = p.tables[p.row_table ? p.row_table[r] : r][t / B];
  const int slot = int(t & (B - 1));
  __half* K = reinterpret_cast<__half*>(blk);
  __half* V = K + size_t(H) * D * B;
  const float* kr = p.k + int64_t(r) * p.k_stride + int64_t(h) * D;
  const float* vr = p.v + int64_t(r) * p.v_stride + int64_t(h) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    K[(size_t(h) * D + c) * B + slot] = __float2half_rn(kr[c]);
    V[(size_t(h) * B + slot) * D + c] = __float2half_rn(vr[c]);
  }
}

// Scalar blocks: grid (rows, n_kv_heads), 64 threads: warp 0 codes the K row, warp 1 the V row
// (element lane + 32*i in register i: register i is block i of the row).
template <PagedElem E>
__global__ void kv_append_scalar_kernel(KVAppendParams p) {
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int r = blockIdx.x, h = blockIdx.y, kind = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int H = p.n_kv_heads, D = p.head_dim, B = p.block_tokens, epl = D / 32;
  constexpr int QB = detail::scalar_block_bytes(E);
  const int64_t t = p.pos[r];
  uint8_t* blk = p.tables[p.row_table ? p.row_table[r] : r][t / B];
  const int slot = int(t & (B - 1));
  const float* x = kind == 0 ? p.k + int64_t(r) * p.k_stride + int64_t(h) * D : p.v + int64_t(r) * p.v_stride + int64_t(h) * D;
  uint8_t* row = blk + ((size_t(kind) * H + size_t(h)) * B + size_t(slot)) * size_t(epl) * QB;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < epl) v[i] = x[lane + 32 * i];
  if (p.rotate) {  // vq::fwht_inplace: the butterflies, then * 1/sqrt(block)
    const int hb = D & -D;
    detail::fwht_warp(v, epl, hb, lane);
    const float s = 1.0f / sqrtf(float(hb));
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < epl) v[i] = __fmul_rn(v[i], s);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < epl) detail::quantize_block_warp<E>(v[i], lane, row + size_t(i) * QB);
}

// Warp per (row, head): x = H x (vq::fwht_inplace's butterflies and scale), f32 or f16 in place.
__global__ void rotate_rows_kernel(RotateRowsParams p) {
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5);
  if (item >= int64_t(p.rows) * p.n_heads) return;
  const int64_t r = item / p.n_heads, h = item % p.n_heads;
  const int D = p.head_dim, epl = D / 32, hb = D & -D;
  const int64_t base = r * p.stride + h * D;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < epl)
      v[i] = p.type == ElemType::f16 ? __half2float(static_cast<const __half*>(p.x)[base + lane + 32 * i])
                                     : static_cast<const float*>(p.x)[base + lane + 32 * i];
  detail::fwht_warp(v, epl, hb, lane);
  const float s = 1.0f / sqrtf(float(hb));
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < epl) {
      if (p.type == ElemType::f16) static_cast<__half*>(p.x)[base + lane + 32 * i] = __float2half_rn(v[i] * s);
      else static_cast<float*>(p.x)[base + lane + 32 * i] = v[i] * s;
    }
}

// blockIdx.y == 0: table updates (thread per update); 1: copies (block per copy).
__global__ void step_fixup_kernel(StepFixupParams p) {
  if (blockIdx.y == 0) {
    if (!p.n_updates) return;
    const int n = *p.n_updates;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
      *p.updates[i].where = p.updates[i].value;
    return;
  }
  if (!p.n_copies) return;
  const int n = *p.n_copies;
  for (int c = blockIdx.x; c < n; c += gridDim.x) {
    const uint4* s = reinterpret_cast<const uint4*>(p.copies[c].src);
    uint4* d = reinterpret_cast<uint4*>(p.copies[c].dst);
    const uint64_t n16 = p.copies[c].bytes / 16;
    for (uint64_t i = threadIdx.x; i < n16; i += blockDim.x) d[i] = s[i];
  }
}

// Warp per (row, query head); element e = lane + 32*i. Same butterflies and rounding as
// vq::transform_queries (x * lambda, the block Walsh-Hadamard, * 1/sqrt(block)) then * scale.
__global__ void query_transform_kernel(QueryTransformParams p) {
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5);
  if (item >= int64_t(p.rows) * p.n_q_heads) return;
  const int r = int(item / p.n_q_heads), qh = int(item % p.n_q_heads);
  const int kh = qh / (p.n_q_heads / p.n_kv_heads);
  const int D = p.head_dim, epl = D / 32, hb = D & -D;
  const float* x = p.q + int64_t(r) * p.q_stride + int64_t(qh) * D;
  const float* lam = p.lambda + int64_t(kh) * D;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < epl) v[i] = x[lane + 32 * i] * lam[lane + 32 * i];
  detail::fwht_warp(v, epl, hb, lane);
  const float s = 1.0f / sqrtf(float(hb));
  float* o = p.out + item * D;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < epl) o[lane + 32 * i] = (v[i] * s) * p.scale;
}

// The learned key transform's queries: o[e] = scale * sum_j N[e][j] (q[j] lambda[j]), the sum in
// ascending j with fp32 FMAs. Block per (tile of kQMapItems (row, query head) items of one KV head,
// KV head, kQMapCols output channels): N^T's columns of the tile (head_dim x kQMapCols) and the items'
// scaled queries are staged in shared memory by wide loads, all in flight at once (the map is
// constant, so it is staged before the PDL wait); then thread per (channel, kQMapItems / 4 items).
// A warp per item reading N^T from L2 one j at a time was latency-bound (~75 us per layer at B=1).
constexpr int kQMapItems = 32, kQMapCols = 64, kQMapThreads = 256;
constexpr int kQMapItemsPerThread = kQMapItems * kQMapCols / kQMapThreads;  // 8
size_t query_map_smem(int D) { return size_t(D) * kQMapCols * 4 + size_t(kQMapItems) * (D + 1) * 4; }

__global__ void __launch_bounds__(kQMapThreads) query_map_kernel(QueryTransformParams p) {
  extern __shared__ __align__(16) float sm[];
  const int D = p.head_dim, G = p.n_q_heads / p.n_kv_heads, kh = blockIdx.y, e0 = blockIdx.z * kQMapCols;
  float* s_n = sm;                     // [D][kQMapCols]: N^T[j][e0 + c]
  float* s_q = sm + D * kQMapCols;     // [kQMapItems][D + 1]
  const float* nt = p.map_t + int64_t(kh) * D * D;
  for (int i = threadIdx.x; i < D * kQMapCols / 4; i += kQMapThreads) {
    const int j = i / (kQMapCols / 4), c4 = i % (kQMapCols / 4);
    reinterpret_cast<float4*>(s_n)[i] = e0 + 4 * c4 < D  // head_dim % 32 == 0: a float4 is all in or all out
                                            ? __ldg(reinterpret_cast<const float4*>(nt + int64_t(j) * D + e0) + c4)
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_wait();  // launched with PDL (pdl.cuh): the queries are the previous kernel's output
  pdl_trigger();
  const int64_t n_items = int64_t(p.rows) * G, it0 = int64_t(blockIdx.x) * kQMapItems;
  const float* lam = p.lambda + int64_t(kh) * D;
  for (int i = threadIdx.x; i < kQMapItems * D; i += kQMapThreads) {
    const int li = i / D, j = i % D;
    const int64_t it = it0 + li;
    float x = 0.0f;
    if (it < n_items) {
      const int64_t r = it / G;
      const int qh = kh * G + int(it % G);
      x = p.q[r * p.q_stride + int64_t(qh) * D + j] * lam[j];
    }
    s_q[li * (D + 1) + j] = x;
  }
  __syncthreads();
  const int c = threadIdx.x % kQMapCols, ig = threadIdx.x / kQMapCols;  // items ig, ig + 4, ...
  if (e0 + c >= D) return;
  float acc[kQMapItemsPerThread];
#pragma unroll
  for (int k = 0; k < kQMapItemsPerThread; ++k) acc[k] = 0.0f;
#pragma unroll 4
  for (int j = 0; j < D; ++j) {
    const float n = s_n[j * kQMapCols + c];
#pragma unroll
    for (int k = 0; k < kQMapItemsPerThread; ++k)
      acc[k] = fmaf(n, s_q[(ig + 4 * k) * (D + 1) + j], acc[k]);
  }
#pragma unroll
  for (int k = 0; k < kQMapItemsPerThread; ++k) {
    const int64_t it = it0 + ig + 4 * k;
    if (it >= n_items) break;
    const int64_t r = it / G;
    const int qh = kh * G + int(it % G);
    p.out[(r * p.n_q_heads + qh) * D + e0 + c] = acc[k] * p.scale;
  }
}

__global__ void bias_add_kernel(BiasAddParams p) {
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int r = blockIdx.y;
  float* x = p.x + int64_t(r) * p.x_stride;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x) x[i] += p.bias[i];
}

__global__ void gather_rows_kernel(GatherRowsParams p) {
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int r = blockIdx.y;
  const float* x = p.x + int64_t(p.index[r]) * p.x_stride;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x) {
    const float v = x[i];
    const int64_t o = int64_t(r) * p.out_stride + i;
    if (p.out_type == ElemType::f32) static_cast<float*>(p.out)[o] = v;
    else if (p.out_type == ElemType::f16) static_cast<__half*>(p.out)[o] = __float2half_rn(v);
    else static_cast<__nv_bfloat16*>(p.out)[o] = __float2bfloat16_rn(v);
  }
}

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return uint32_t(x);
}

__global__ void random_fill_kernel(RandomFillParams p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) s += float(hash32((uint64_t(i) * 4 + k) ^ (p.seed * 0x9e3779b97f4a7c15ULL))) * 2.3283064e-10f;
    // sum of 4 U(0,1): mean 2, variance 1/3 -> (s - 2) * sqrt(3) ~ N(0, 1)
    const float v = p.offset + p.scale * (s - 2.0f) * 1.7320508f;
    if (p.type == ElemType::f32) static_cast<float*>(p.out)[i] = v;
    else if (p.type == ElemType::f16) static_cast<__half*>(p.out)[i] = __float2half_rn(v);
    else static_cast<__nv_bfloat16*>(p.out)[i] = __float2bfloat16_rn(v);
  }
}

unsigned grid_1d(int64_t n, int threads) { return unsigned(std::min<int64_t>((n + threads - 1) / threads, 65535)); }

}  // namespace

void kv_append_device(const KVAppendParams& p, void* stream) {
  VQ_CHECK(p.rows >= 0 && p.n_kv_heads >= 1 && p.head_dim >= 1,
           "cuda::kv_append: rows {} n_kv_heads {} head_dim {}", p.rows, p.n_kv_heads, p.head_dim);
  VQ_CHECK(p.block_tokens >= 16 && (p.block_tokens & (p.block_tokens - 1)) == 0,
           "cuda::kv_append: block_tokens {} must be a power of two >= 16", p.block_tokens);
  if (p.rows == 0) return;
  VQ_CHECK(p.k && p.v && p.pos && p.tables, "cuda::kv_append: null k, v, pos or tables");
  KVAppendParams q = p;
  if (!q.k_stride) q.k_stride = int64_t(p.n_kv_heads) * p.head_dim;
  if (!q.v_stride) q.v_stride = int64_t(p.n_kv_heads) * p.head_dim;
  VQ_CHECK(p.rows <= 2147483647 && p.n_kv_heads <= 65535, "cuda::kv_append: grid too large");
  if (p.elem != PagedElem::f16) {
    VQ_CHECK(p.head_dim % 32 == 0 && p.head_dim <= 256 && (!p.rotate || (p.head_dim & (p.head_dim - 1)) == 0),
             "cuda::kv_append: scalar blocks need head_dim % 32 == 0 and <= 256 (a power of two to rotate), not {}",
             p.head_dim);
    const dim3 grid(unsigned(p.rows), unsigned(p.n_kv_heads));
    const cudaStream_t st = as_stream(stream);
    detail::with_scalar_elem(p.elem, [&](auto tag) {
      launch_pdl("kv_append_scalar_kernel", kv_append_scalar_kernel<decltype(tag)::value>, grid, dim3(64), 0, st, q);
    });
    return;
  }
  launch_pdl("kv_append_kernel", kv_append_kernel, dim3(unsigned(p.rows), unsigned(p.n_kv_heads)), dim3(128), 0,
             as_stream(stream), q);
}

void step_fixup_device(const StepFixupParams& p, void* stream) {
  VQ_CHECK(p.max_updates >= 0 && p.max_copies >= 0, "cuda::step_fixup: negative maxima");
  if (p.max_updates == 0 && p.max_copies == 0) return;
  VQ_CHECK((p.max_updates == 0 || (p.n_updates && p.updates)) && (p.max_copies == 0 || (p.n_copies && p.copies)),
           "cuda::step_fixup: null counts or lists");
  const unsigned gx = std::max(grid_1d(p.max_updates, 256), unsigned(std::min(p.max_copies, 65535)));
  StepFixupParams q = p;
  if (p.max_updates == 0) q.n_updates = nullptr;
  if (p.max_copies == 0) q.n_copies = nullptr;
  step_fixup_kernel<<<dim3(std::max(gx, 1u), 2), 256, 0, as_stream(stream)>>>(q);
  VQ_CUDA_LAUNCHED("step_fixup_kernel");
}

void query_transform_device(const QueryTransformParams& p, void* stream) {
  VQ_CHECK(p.head_dim % 32 == 0 && p.head_dim <= 256 && p.head_dim >= 32,
           "cuda::query_transform: head_dim {} must be a multiple of 32 in 32..256", p.head_dim);
  VQ_CHECK(p.n_kv_heads >= 1 && p.n_q_heads % p.n_kv_heads == 0,
           "cuda::query_transform: n_q_heads {} is not a multiple of n_kv_heads {}", p.n_q_heads, p.n_kv_heads);
  if (p.rows == 0) return;
  VQ_CHECK(p.q && p.lambda && p.out, "cuda::query_transform: null q, lambda or out");
  QueryTransformParams q = p;
  if (!q.q_stride) q.q_stride = int64_t(p.n_q_heads) * p.head_dim;
  if (p.map_t) {
    const int G = p.n_q_heads / p.n_kv_heads;
    const int64_t tiles = (int64_t(p.rows) * G + kQMapItems - 1) / kQMapItems;
    const size_t smem = query_map_smem(p.head_dim);
    detail::ensure_smem_attr(query_map_kernel, smem);
    const dim3 grid(unsigned(tiles), unsigned(p.n_kv_heads), unsigned((p.head_dim + kQMapCols - 1) / kQMapCols));
    launch_pdl("query_map_kernel", query_map_kernel, grid, dim3(kQMapThreads), smem, as_stream(stream), q);
    return;
  }
  const int64_t items = int64_t(p.rows) * p.n_q_heads;
  launch_pdl("query_transform_kernel", query_transform_kernel, dim3(unsigned((items + 3) / 4)), dim3(128), 0,
             as_stream(stream), q);
}

void rotate_rows_device(const RotateRowsParams& p, void* stream) {
  VQ_CHECK(p.head_dim % 32 == 0 && p.head_dim >= 32 && p.head_dim <= 256 && p.n_heads >= 1,
           "cuda::rotate_rows: head_dim {} (a multiple of 32 in 32..256), n_heads {}", p.head_dim, p.n_heads);
  VQ_CHECK(p.type == ElemType::f32 || p.type == ElemType::f16, "cuda::rotate_rows: type {} (f32 or f16)",
           elem_type_name(p.type));
  if (p.rows == 0) return;
  VQ_CHECK(p.x, "cuda::rotate_rows: null x");
  RotateRowsParams q = p;
  if (!q.stride) q.stride = int64_t(p.n_heads) * p.head_dim;
  const int64_t items = int64_t(p.rows) * p.n_heads;
  launch_pdl("rotate_rows_kernel", rotate_rows_kernel, dim3(unsigned((items + 3) / 4)), dim3(128), 0, as_stream(stream),
             q);
}

void bias_add_device(const BiasAddParams& p, void* stream) {
  if (p.rows == 0 || p.n == 0) return;
  VQ_CHECK(p.x && p.bias && p.rows <= 65535, "cuda::bias_add: null x/bias or rows {} > 65535", p.rows);
  BiasAddParams q = p;
  if (!q.x_stride) q.x_stride = p.n;
  launch_pdl("bias_add_kernel", bias_add_kernel, dim3(grid_1d(p.n, 256), unsigned(p.rows)), dim3(256), 0,
             as_stream(stream), q);
}

void gather_rows_device(const GatherRowsParams& p, void* stream) {
  if (p.rows == 0 || p.n == 0) return;
  VQ_CHECK(p.x && p.index && p.out && p.rows <= 65535, "cuda::gather_rows: null x/index/out or rows {} > 65535",
           p.rows);
  GatherRowsParams q = p;
  if (!q.x_stride) q.x_stride = p.n;
  if (!q.out_stride) q.out_stride = p.n;
  launch_pdl("gather_rows_kernel", gather_rows_kernel, dim3(grid_1d(p.n, 256), unsigned(p.rows)), dim3(256), 0,
             as_stream(stream), q);
}

void random_fill_device(const RandomFillParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::random_fill: {}", cuda_unavailable_reason());
  if (p.n <= 0) return;
  VQ_CHECK(p.out != nullptr, "cuda::random_fill: null out");
  random_fill_kernel<<<grid_1d(p.n, 256), 256, 0, as_stream(stream)>>>(p);
  VQ_CUDA_LAUNCHED("random_fill_kernel");
}

}  // namespace vq::cuda
