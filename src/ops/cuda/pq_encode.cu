// Fused nearest-centroid encoder (see pq.h). Design and measured variants: docs/CUDA_NOTES.md.
//
// One block = one head x a tile of TT = 32*R tokens (x a group of 8 sub-spaces for pool blocks of
// 32 tokens: EncodeParams::sub_groups), 256 threads (8 warps); in the batched mode grid z strides
// over the step's jobs.
//  phase 1: the tile's vectors are loaded (f32/f16/bf16), smoothed and Walsh-Hadamard rotated
//           (one warp per token, butterflies across lanes by shuffles) into shared memory, or
//           with the learned key transform mapped by a dense head_dim x head_dim matrix there;
//  phase 2: a warp takes one sub-space at a time; each lane owns R tokens of it, keeps -2x in
//           registers and scans the codebook from shared memory (broadcast reads), computing
//           |c|^2 - 2 x.c with fp32 FMAs; the running min and argmin stay in registers (exact
//           compare + select; splicing the index into the distance's low mantissa bits would
//           save one instruction per pair but breaks fp32 parity, see docs/CUDA_NOTES.md).
//  phase 3: codes are bit-packed from shared memory and written as whole rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/smem_attr.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/hadamard.cuh"
#include "ops/cuda/kv_blocks_cuda.h"
#include "ops/cuda/stream_cuda.h"
#include "ops/cuda/pq.h"

namespace vq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPad = 4;  // floats of padding per x row: lanes on consecutive rows hit different banks
constexpr int kSubGroup = 8;  // sub-spaces per block with EncodeParams::sub_groups > 1

struct EncodeParams {
  int64_t n_tokens;
  int n_heads, head_dim, n_sub, K, books;
  int elem;  // 0 f32, 1 f16, 2 bf16
  const void* x;
  int64_t x_token_stride, x_head_stride;  // elements
  const float* lambda;                    // [n_heads, head_dim] or null
  int hblock;                             // Walsh-Hadamard block (0: none)
  const float* map_t;                     // the learned key map M^T [n_heads][head_dim][head_dim] or null
  const float* codebooks;                 // [n_heads, books, K, DS]
  uint16_t* codes16;                      // plain output [n_tokens, n_sub] (n_heads == 1), or null
  uint8_t* packed;                        // packed output, or null
  int bits, row_bytes;
  int64_t code_head_stride, code_token_stride;
  int64_t x_elem_stride;  // elements between the channels of a vector (1; B for channel-major pool keys)
  // Batched over KV pool blocks: job z = blockIdx.z (< *n_jobs) reads x at jobs[z].dense +
  // x_job_offset bytes and writes packed rows at jobs[z].coded + code_job_offset bytes.
  const BlockEncodeJob* jobs;
  const int* n_jobs;
  int64_t x_job_offset, code_job_offset;
  int grid_jobs;  // grid z: max_jobs in the batched mode, else 1
  // Sub-space groups: grid x = token tiles x sub_groups; block x % sub_groups codes sub-spaces
  // [8 g, 8 g + 8) of its tile (8 sub-spaces end on a byte boundary at any width), staging only
  // their books. 1: every sub-space in one block. Few tokens (a pool block) spread this way.
  int sub_groups;
  // Keys of a calibration with the rotated key mean (batched mode): token t of a job is at position
  // jobs[z].pos0 + t and is coded as x - R(p_b) mu (key_mean_cuda.h). km.n_pairs == 0: none.
  KeyMeanDevice km;
  int64_t pos0;
};

// Job z's view of the arguments (unchanged outside the batched mode); false: no such job.
__device__ __forceinline__ bool job_params(EncodeParams& p, int z) {
  if (!p.jobs) return z == 0;
  if (z >= *p.n_jobs) return false;
  p.x = p.jobs[z].dense + p.x_job_offset;
  p.packed = p.jobs[z].coded + p.code_job_offset;
  p.pos0 = p.jobs[z].pos0;
  return true;
}

__device__ __forceinline__ float load_elem(const void* p, int64_t i, int elem) {
  if (elem == 0) return static_cast<const float*>(p)[i];
  if (elem == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// Phase 1, warp per token, head_dim % 32 == 0 and <= 256: element e = lane + 32*i.
__device__ void transform_rows_warp(const EncodeParams& p, int h, int64_t t0, int tt, float* s_x, int ldx) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int epl = p.head_dim / 32;
  const float scale = p.hblock ? rsqrtf(float(p.hblock)) : 1.0f;
  for (int r = warp; r < tt; r += kWarps) {
    const int64_t base = (t0 + r) * p.x_token_stride + int64_t(h) * p.x_head_stride;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < epl) {
        const int e = lane + 32 * i;
        float x = load_elem(p.x, base + e * p.x_elem_stride, p.elem);
        if (p.km.n_pairs) x -= key_mean_offset(p.km, h, p.head_dim, p.pos0 + t0 + r, e);
        if (p.lambda) x = x / p.lambda[int64_t(h) * p.head_dim + e];
        v[i] = x;
      }
    if (p.hblock) detail::fwht_warp(v, epl, p.hblock, lane);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < epl) s_x[r * ldx + lane + 32 * i] = v[i] * scale;
  }
}

// Phase 1 without a Hadamard rotation (any head_dim): plain strided copy with smoothing.
__device__ void load_rows_plain(const EncodeParams& p, int h, int64_t t0, int tt, float* s_x, int ldx) {
  const int n = tt * p.head_dim;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int r = i / p.head_dim, e = i - r * p.head_dim;
    float x = load_elem(p.x, (t0 + r) * p.x_token_stride + int64_t(h) * p.x_head_stride + e * p.x_elem_stride, p.elem);
    if (p.km.n_pairs) x -= key_mean_offset(p.km, h, p.head_dim, p.pos0 + t0 + r, e);
    if (p.lambda) x = x / p.lambda[int64_t(h) * p.head_dim + e];
    s_x[r * ldx + e] = x;
  }
}

// Phase 1b, the learned key map (codec/learned_key_map.h) on the tile in place: x <- M x per row,
// each output sum_j M[e][j] x[j] in ascending j with fp32 FMAs. Thread per (row, channel) output,
// up to kMapOuts of them; rows go in chunks whose outputs all fit, so a chunk reads only rows that
// no other chunk writes.
constexpr int kMapOuts = 8;
__device__ void map_rows_smem(const EncodeParams& p, int h, int tt, float* s_x, int ldx) {
  const int D = p.head_dim;
  const float* mt = p.map_t + int64_t(h) * D * D;
  const int chunk_rows = max(1, kThreads * kMapOuts / D);
  for (int r0 = 0; r0 < tt; r0 += chunk_rows) {
    const int n_out = min(chunk_rows, tt - r0) * D;
    float acc[kMapOuts];
    int row[kMapOuts], col[kMapOuts];
#pragma unroll
    for (int i = 0; i < kMapOuts; ++i) {
      const int o = threadIdx.x + kThreads * i;
      row[i] = r0 + (o < n_out ? o / D : 0);
      col[i] = o < n_out ? o % D : 0;
      acc[i] = 0.0f;
    }
    for (int j = 0; j < D; ++j) {
#pragma unroll
      for (int i = 0; i < kMapOuts; ++i)
        if (threadIdx.x + kThreads * i < n_out)
          acc[i] = fmaf(__ldg(mt + int64_t(j) * D + col[i]), s_x[row[i] * ldx + j], acc[i]);
    }
    __syncthreads();  // every output of the chunk read its rows
#pragma unroll
    for (int i = 0; i < kMapOuts; ++i)
      if (threadIdx.x + kThreads * i < n_out) s_x[row[i] * ldx + col[i]] = acc[i];
    __syncthreads();
  }
}

template <int DS, int R>
__global__ void __launch_bounds__(kThreads) encode_kernel(EncodeParams p0) {
  constexpr int TT = 32 * R;
  extern __shared__ __align__(16) float smem[];
  EncodeParams p = p0;
  if (!job_params(p, int(blockIdx.z))) return;
  const int h = blockIdx.y;
  const int grp = int(blockIdx.x) % p.sub_groups;
  const int64_t t0 = int64_t(blockIdx.x / p.sub_groups) * TT;
  const int tt = int(p.n_tokens - t0 < TT ? p.n_tokens - t0 : TT);
  const int ldx = p.head_dim + kPad;
  // this block's sub-spaces [s0, s1) and the books it stages (the first staged one is book b0)
  const int s0 = p.sub_groups > 1 ? grp * kSubGroup : 0, s1 = p.sub_groups > 1 ? min(p.n_sub, s0 + kSubGroup) : p.n_sub;
  const int b0 = p.books > 1 ? s0 : 0, n_books = p.books > 1 ? s1 - s0 : 1;
  const int book_floats = n_books * p.K * DS;
  // smem: s_x [TT, ldx] f32 | s_book [n_books, K, DS] f32 | s_cn [n_books, K] f32 | s_codes [TT, n_sub] u16
  float* s_x = smem;
  float* s_book = s_x + TT * ldx;
  float* s_cn = s_book + book_floats;
  uint16_t* s_codes = reinterpret_cast<uint16_t*>(s_cn + n_books * p.K);

  // Stage this head's codebook(s), then |c|^2, while the first job's vectors are transformed; the
  // block's later jobs (grid z strides over the batched mode's jobs) reuse them.
  const float* g_book = p.codebooks + (int64_t(h) * p.books + b0) * p.K * DS;
  if ((reinterpret_cast<uintptr_t>(g_book) & 15) == 0) {
    for (int i = threadIdx.x; i < book_floats / 4; i += kThreads)
      reinterpret_cast<float4*>(s_book)[i] = __ldg(reinterpret_cast<const float4*>(g_book) + i);
  } else {
    for (int i = threadIdx.x; i < book_floats; i += kThreads) s_book[i] = __ldg(g_book + i);
  }
  for (int z = int(blockIdx.z); job_params(p, z); z += int(gridDim.z)) {
    if (p.hblock) transform_rows_warp(p, h, t0, tt, s_x, ldx);
    else load_rows_plain(p, h, t0, tt, s_x, ldx);
    __syncthreads();
    if (p.map_t) map_rows_smem(p, h, tt, s_x, ldx);
    if (z == int(blockIdx.z))
      for (int c = threadIdx.x; c < n_books * p.K; c += kThreads) {
        const float* cp = s_book + c * DS;
        float n = 0.0f;
#pragma unroll
        for (int e = 0; e < DS; ++e) n = fmaf(cp[e], cp[e], n);
        s_cn[c] = n;
      }
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int sub = s0 + warp; sub < s1; sub += kWarps) {
      const int bk = p.books > 1 ? sub - b0 : 0;
      const float* book = s_book + bk * p.K * DS;
      const float* cn = s_cn + bk * p.K;
      float x2[R][DS];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int t = lane + 32 * r;
        const float* xp = s_x + (t < tt ? t : 0) * ldx + sub * DS;
#pragma unroll
        for (int e = 0; e < DS; e += 4) {
          const float4 v = *reinterpret_cast<const float4*>(xp + e);
          x2[r][e] = -2.0f * v.x, x2[r][e + 1] = -2.0f * v.y, x2[r][e + 2] = -2.0f * v.z, x2[r][e + 3] = -2.0f * v.w;
        }
      }
      // NCH independent argmin chains per token (chain k scans centroids k, k + NCH, ... in order),
      // merged below as the one in-order scan would: a lower distance wins, a tie keeps the lower
      // index. Few tokens per lane (R = 1: pool blocks) are otherwise one dependent chain per lane.
      constexpr int NCH = R >= 4 ? 1 : 4 / R;
      float best[R][NCH];
      uint32_t best_code[R][NCH];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int k = 0; k < NCH; ++k) best[r][k] = INFINITY, best_code[r][k] = uint32_t(k);
      auto visit = [&](int c, int k) {
        float cc[DS];
#pragma unroll
        for (int e = 0; e < DS; e += 4) {
          const float4 v = *reinterpret_cast<const float4*>(book + c * DS + e);
          cc[e] = v.x, cc[e + 1] = v.y, cc[e + 2] = v.z, cc[e + 3] = v.w;
        }
        const float n = cn[c];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float acc = n;
#pragma unroll
          for (int e = 0; e < DS; ++e) acc = fmaf(x2[r][e], cc[e], acc);
          // Exact running argmin (FSETP + 2 SEL). NaN never compares below; ties keep the lower index.
          const bool lt = acc < best[r][k];
          best[r][k] = lt ? acc : best[r][k];
          best_code[r][k] = lt ? uint32_t(c) : best_code[r][k];
        }
      };
      int c0 = 0;
#pragma unroll 2
      for (; c0 + NCH <= p.K; c0 += NCH)
#pragma unroll
        for (int k = 0; k < NCH; ++k) visit(c0 + k, k);
      for (int k = 0; c0 + k < p.K; ++k) visit(c0 + k, k);  // K < NCH
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int k = 1; k < NCH; ++k) {
          // chain k never updated (K <= k, or every distance NaN) keeps INFINITY and loses every tie
          // to chain 0, whose untouched code is 0, as the single scan would give
          const bool lt = best[r][k] < best[r][0] || (best[r][k] == best[r][0] && best_code[r][k] < best_code[r][0]);
          best[r][0] = lt ? best[r][k] : best[r][0];
          best_code[r][0] = lt ? best_code[r][k] : best_code[r][0];
        }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int t = lane + 32 * r;
        if (t < tt) s_codes[t * p.n_sub + sub] = uint16_t(best_code[r][0]);
      }
    }
    __syncthreads();

    if (p.codes16) {
      const int ns = s1 - s0;
      for (int i = threadIdx.x; i < tt * ns; i += kThreads) {
        const int r = i / ns, j = s0 + i % ns;
        p.codes16[(t0 + r) * p.n_sub + j] = s_codes[r * p.n_sub + j];
      }
      __syncthreads();
      continue;
    }
    // Bit-pack: thread per (token, byte) of this block's bytes [by0, by1) of a row.
    const int by0 = s0 * p.bits / 8, by1 = s1 == p.n_sub ? p.row_bytes : s1 * p.bits / 8, nby = by1 - by0;
    for (int i = threadIdx.x; i < tt * nby; i += kThreads) {
      const int r = i / nby, bi = by0 + i % nby;
      const uint16_t* cr = s_codes + r * p.n_sub;
      const int lo = 8 * bi;
      uint32_t v = 0;
      for (int j = lo / p.bits; j < p.n_sub && j * p.bits < lo + 8; ++j) {
        const int off = j * p.bits - lo;
        const uint32_t c = cr[j];
        v |= off >= 0 ? (c << off) : (c >> (-off));
      }
      p.packed[int64_t(h) * p.code_head_stride + (t0 + r) * p.code_token_stride + bi] = uint8_t(v & 0xffu);
    }
    __syncthreads();  // every code of this job packed before the next one's rows overwrite s_x, s_codes
  }
}

// Generic fallback (any sub_dim, codebooks too large for shared memory): one thread per
// row (token, head), direct sum of squared differences, codebook read through the L1 cache.
// With the Hadamard rotation (head_dim <= 256) the row is transformed in the thread first.
__global__ void encode_generic_kernel(EncodeParams p0, int DS) {
  EncodeParams p = p0;
  if (!job_params(p, int(blockIdx.z))) return;
  const int h = blockIdx.y;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < p.n_tokens;
       t += int64_t(gridDim.x) * blockDim.x) {
    uint8_t* row = p.packed ? p.packed + int64_t(h) * p.code_head_stride + t * p.code_token_stride : nullptr;
    const int64_t xrow = t * p.x_token_stride + int64_t(h) * p.x_head_stride;
    float xt[256];  // the transformed row (hblock > 0 or map_t only)
    if (p.hblock || p.map_t) {
      for (int e = 0; e < p.head_dim; ++e) {
        float x = load_elem(p.x, xrow + e * p.x_elem_stride, p.elem);
        if (p.km.n_pairs) x -= key_mean_offset(p.km, h, p.head_dim, p.pos0 + t, e);
        if (p.lambda) x = x / p.lambda[int64_t(h) * p.head_dim + e];
        xt[e] = x;
      }
      if (p.map_t) {  // map_rows_smem's sums, in the same order
        const float* mt = p.map_t + int64_t(h) * p.head_dim * p.head_dim;
        float yt[256];
        for (int e = 0; e < p.head_dim; ++e) {
          float acc = 0.0f;
          for (int j = 0; j < p.head_dim; ++j) acc = fmaf(__ldg(mt + int64_t(j) * p.head_dim + e), xt[j], acc);
          yt[e] = acc;
        }
        for (int e = 0; e < p.head_dim; ++e) xt[e] = yt[e];
      }
      // Same butterfly order as vq::fwht_inplace.
      for (int base = 0; p.hblock && base < p.head_dim; base += p.hblock)
        for (int hh = 1; hh < p.hblock; hh <<= 1)
          for (int i = 0; i < p.hblock; i += 2 * hh)
            for (int j = i; j < i + hh; ++j) {
              const float a = xt[base + j], b = xt[base + j + hh];
              xt[base + j] = a + b;
              xt[base + j + hh] = a - b;
            }
      const float sc = p.hblock ? 1.0f / sqrtf(float(p.hblock)) : 1.0f;
      for (int e = 0; e < p.head_dim; ++e) xt[e] *= sc;
    }
    uint32_t acc_bits = 0;  // pending packed bits, LSB-first
    int n_pending = 0, out_byte = 0;
    for (int sub = 0; sub < p.n_sub; ++sub) {
      const float* book = p.codebooks + (int64_t(h) * p.books + (p.books > 1 ? sub : 0)) * p.K * DS;
      float xs[16];
      for (int e = 0; e < DS; ++e) {
        const int ch = sub * DS + e;
        float x;
        if (p.hblock || p.map_t) {
          x = xt[ch];
        } else {
          x = load_elem(p.x, xrow + int64_t(ch) * p.x_elem_stride, p.elem);
          if (p.km.n_pairs) x -= key_mean_offset(p.km, h, p.head_dim, p.pos0 + t, ch);
          if (p.lambda) x = x / p.lambda[int64_t(h) * p.head_dim + ch];
        }
        xs[e] = x;
      }
      float best = INFINITY;
      int bc = 0;
      for (int c = 0; c < p.K; ++c) {
        float acc = 0.0f;
        for (int e = 0; e < DS; ++e) {
          const float d = xs[e] - __ldg(book + int64_t(c) * DS + e);
          acc = fmaf(d, d, acc);
        }
        if (acc < best) best = acc, bc = c;
      }
      if (p.codes16) {
        p.codes16[t * p.n_sub + sub] = uint16_t(bc);
      } else {
        acc_bits |= uint32_t(bc) << n_pending;
        n_pending += p.bits;
        while (n_pending >= 8) {
          row[out_byte++] = uint8_t(acc_bits & 0xffu);
          acc_bits >>= 8;
          n_pending -= 8;
        }
      }
    }
    if (row && n_pending > 0) row[out_byte] = uint8_t(acc_bits & 0xffu);
  }
}

int max_smem_per_block() {
  static int v = [] {
    int dev = 0, bytes = 0;
    VQ_CUDA_CHECK(cudaGetDevice(&dev));
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return bytes;
  }();
  return v;
}

size_t fast_smem_bytes(const EncodeParams& p, int DS, int R) {
  const size_t tt = 32 * size_t(R);
  const size_t books = p.books > 1 && p.sub_groups > 1 ? size_t(std::min(p.n_sub, kSubGroup)) : size_t(p.books);
  return tt * (p.head_dim + kPad) * 4 + books * p.K * DS * 4 + books * p.K * 4 + tt * p.n_sub * 2 + 16;
}

template <int DS, int R>
bool try_launch(const EncodeParams& p, cudaStream_t st) {
  const size_t smem = fast_smem_bytes(p, DS, R);
  if (smem > size_t(max_smem_per_block())) return false;
  auto k = encode_kernel<DS, R>;
  detail::ensure_smem_attr(k, smem);
  const int64_t tiles = (p.n_tokens + 32 * R - 1) / (32 * R);
  // Batched mode: grid z strides over the jobs (their count is on the device); about four blocks
  // per SM in all, not one per possible job (most of max_jobs are empty in a decode step, and each
  // empty block still takes its shared memory).
  int64_t gz = p.grid_jobs;
  if (p.jobs) gz = std::clamp<int64_t>(4 * device_sm_count() / std::max<int64_t>(1, tiles * p.sub_groups * p.n_heads), 1, gz);
  const dim3 grid(unsigned(tiles * p.sub_groups), unsigned(p.n_heads), unsigned(gz));
  k<<<grid, kThreads, smem, st>>>(p);
  VQ_CUDA_LAUNCHED("encode_kernel");
  return true;
}

// R = 8 sub-vectors per thread amortises centroid loads best, but only when it still gives
// two blocks per SM; otherwise R = 4 (more, smaller blocks), then 2 (shared memory).
template <int DS>
bool try_fast(EncodeParams p, cudaStream_t st) {
  if (p.jobs && p.n_tokens <= 32) {  // pool blocks of 32 tokens: few blocks, so sub-spaces in groups
    p.sub_groups = (p.n_sub + kSubGroup - 1) / kSubGroup;
    return try_launch<DS, 1>(p, st);
  }
  if constexpr (DS <= 8) {
    const int64_t blocks8 = (p.n_tokens + 255) / 256 * p.n_heads;
    if (blocks8 >= 2 * device_sm_count() && try_launch<DS, 8>(p, st)) return true;
  }
  if (try_launch<DS, 4>(p, st)) return true;
  return try_launch<DS, 2>(p, st);
}

void launch_encode(EncodeParams p, int DS, cudaStream_t st) {
  VQ_CHECK(cuda_device_available(), "CUDA pq encode: {}", cuda_unavailable_reason());
  if (p.n_tokens == 0) return;
  VQ_CHECK(p.n_tokens <= int64_t(65535) * 1024 * 64, "CUDA pq encode: n = {} too large", p.n_tokens);
  VQ_CHECK(p.n_heads >= 1 && p.n_heads <= 65535, "CUDA pq encode: n_heads = {} out of range", p.n_heads);
  p.sub_groups = 1;
  bool done = false;
  if (DS == 4) done = try_fast<4>(p, st);
  else if (DS == 8) done = try_fast<8>(p, st);
  else if (DS == 16) done = try_fast<16>(p, st);
  if (done) return;
  VQ_CHECK((p.hblock == 0 && !p.map_t) || p.head_dim <= 256,
           "CUDA fused encode: head_dim {} / sub_dim {} / {} centroids with the Hadamard rotation does not fit "
           "the fast kernel (sub_dim must be 4, 8 or 16 and the codebooks must fit in shared memory) and the "
           "generic kernel takes head_dim <= 256",
           p.head_dim, DS, p.K);
  VQ_CHECK(DS <= 16, "CUDA pq encode: sub_dim {} > 16", DS);
  const int threads = p.jobs ? 32 : 128;
  const unsigned blocks = unsigned(std::min<int64_t>((p.n_tokens + threads - 1) / threads, 65535));
  encode_generic_kernel<<<dim3(blocks, unsigned(p.n_heads), unsigned(p.grid_jobs)), threads, 0, st>>>(p, DS);
  VQ_CUDA_LAUNCHED("encode_generic_kernel");
}

}  // namespace

void pq_encode_device(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes, void* stream) {
  check_pq_shape(s, "cuda::pq_encode");
  EncodeParams p{};
  p.n_tokens = s.n;
  p.n_heads = 1;
  p.head_dim = s.n_sub * s.sub_dim;
  p.n_sub = s.n_sub;
  p.K = s.n_centroids;
  p.books = s.per_subspace ? s.n_sub : 1;
  p.elem = 0;
  p.x = x;
  p.x_token_stride = p.head_dim;
  p.x_head_stride = 0;
  p.x_elem_stride = 1;
  p.grid_jobs = 1;
  p.codebooks = codebooks;
  p.codes16 = codes;
  launch_encode(p, s.sub_dim, as_stream(stream));
}

void fused_encode_device(const FusedEncodeArgs& a, void* stream) {
  VQ_CHECK(a.n_tokens >= 0, "cuda::fused_encode: n_tokens = {} < 0", a.n_tokens);
  VQ_CHECK(a.sub_dim >= 1 && a.head_dim >= 1 && a.head_dim % a.sub_dim == 0,
           "cuda::fused_encode: head_dim {} is not a multiple of sub_dim {}", a.head_dim, a.sub_dim);
  VQ_CHECK(a.bits >= 1 && a.bits <= 16, "cuda::fused_encode: bits = {} must be in 1..16", a.bits);
  VQ_CHECK(a.x && a.codebooks && a.codes, "cuda::fused_encode: null x, codebooks or codes");
  int hblock = 0;
  if (a.hadamard) {
    hblock = a.head_dim & -a.head_dim;
    VQ_CHECK(a.head_dim % 32 == 0 && a.head_dim <= 256 && hblock >= 8,
             "cuda::fused_encode: the Hadamard rotation needs head_dim % 32 == 0 and <= 256, got {}", a.head_dim);
  }
  EncodeParams p{};
  p.n_tokens = a.n_tokens;
  p.n_heads = a.n_heads;
  p.head_dim = a.head_dim;
  p.n_sub = a.head_dim / a.sub_dim;
  p.K = 1 << a.bits;
  p.books = a.per_subspace ? p.n_sub : 1;
  p.elem = a.in_type == ElemType::f32 ? 0 : a.in_type == ElemType::f16 ? 1 : 2;
  p.x = a.x;
  p.x_token_stride = a.x_token_stride ? a.x_token_stride : int64_t(a.n_heads) * a.head_dim;
  p.x_head_stride = a.head_dim;
  p.x_elem_stride = 1;
  p.grid_jobs = 1;
  p.lambda = a.lambda;
  p.hblock = hblock;
  p.codebooks = a.codebooks;
  p.packed = a.codes;
  p.bits = a.bits;
  p.row_bytes = int(code_row_bytes(p.n_sub, a.bits));
  p.code_head_stride = a.code_head_stride;
  p.code_token_stride = a.code_token_stride ? a.code_token_stride : p.row_bytes;
  launch_encode(p, a.sub_dim, as_stream(stream));
}

void pq_encode(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes) {
  check_pq_shape(s, "cuda::pq_encode");
  const size_t xb = size_t(s.n) * s.n_sub * s.sub_dim * 4;
  const size_t cb = size_t(pq_n_books(s)) * s.n_centroids * s.sub_dim * 4;
  const size_t ob = size_t(s.n) * s.n_sub * 2;
  DeviceBuffer dx = to_device(x, xb), dc = to_device(codebooks, cb), dout(ob);
  pq_encode_device(s, dx.as<float>(), dc.as<float>(), dout.as<uint16_t>());
  device_synchronize();
  dout.download(codes, ob);
}

void kv_encode_blocks_device(const KVEncodeParams& a, void* stream) {
  VQ_CHECK(a.n_kv_heads >= 1 && a.n_kv_heads <= 65535 && a.block_tokens >= 16 && a.block_tokens <= 32,
           "cuda::kv_encode_blocks: n_kv_heads {} block_tokens {} (the device pool encodes blocks of 16..32 tokens)",
           a.n_kv_heads, a.block_tokens);
  VQ_CHECK(a.head_dim % 32 == 0 && a.head_dim <= 256, "cuda::kv_encode_blocks: head_dim {} must be a multiple of 32 "
           "up to 256 (Hadamard rotation)", a.head_dim);
  VQ_CHECK(a.max_jobs >= 0 && a.max_jobs <= 65535, "cuda::kv_encode_blocks: max_jobs {} out of range", a.max_jobs);
  if (a.max_jobs == 0) return;
  VQ_CHECK(a.n_jobs && a.jobs && a.lambda && a.k_books && a.v_books, "cuda::kv_encode_blocks: null jobs or books");
  const int H = a.n_kv_heads, D = a.head_dim, B = a.block_tokens;
  for (int side = 0; side < 2; ++side) {
    const int d = side ? a.v_sub_dim : a.k_sub_dim, bits = side ? a.v_bits : a.k_bits;
    VQ_CHECK(d >= 1 && D % d == 0 && bits >= 1 && bits <= 16, "cuda::kv_encode_blocks: {} preset d{}b{} with head_dim {}",
             side ? "value" : "key", d, bits, D);
  }
  const int krow = int(code_row_bytes(D / a.k_sub_dim, a.k_bits));
  for (int side = 0; side < 2; ++side) {
    EncodeParams p{};
    p.n_tokens = B;
    p.n_heads = H;
    p.head_dim = D;
    p.elem = 1;  // fp16 dense blocks
    p.jobs = a.jobs;
    p.n_jobs = a.n_jobs;
    p.grid_jobs = a.max_jobs;
    if (side == 0) {  // keys: channel-major [H][D][B]
      p.n_sub = D / a.k_sub_dim;
      p.K = 1 << a.k_bits;
      p.books = a.k_per_subspace ? p.n_sub : 1;
      p.x_token_stride = 1, p.x_head_stride = int64_t(D) * B, p.x_elem_stride = B;
      p.x_job_offset = 0;
      p.lambda = a.lambda;
      p.map_t = a.key_map_t;
      p.hblock = a.key_map_t ? 0 : D & -D;
      p.codebooks = a.k_books;
      p.km = a.key_mean;
      p.bits = a.k_bits;
      p.code_job_offset = 0;
    } else {  // values: [H][B][D] after the keys
      p.n_sub = D / a.v_sub_dim;
      p.K = 1 << a.v_bits;
      p.books = a.v_per_subspace ? p.n_sub : 1;
      p.x_token_stride = D, p.x_head_stride = int64_t(B) * D, p.x_elem_stride = 1;
      p.x_job_offset = int64_t(H) * D * B * 2;
      p.codebooks = a.v_books;
      p.bits = a.v_bits;
      p.code_job_offset = int64_t(H) * B * krow;
    }
    p.row_bytes = int(code_row_bytes(p.n_sub, p.bits));
    p.code_token_stride = p.row_bytes;
    p.code_head_stride = int64_t(B) * p.row_bytes;
    launch_encode(p, side ? a.v_sub_dim : a.k_sub_dim, as_stream(stream));
  }
}

}  // namespace vq::cuda
