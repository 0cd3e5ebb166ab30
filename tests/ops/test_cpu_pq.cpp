// CPU-specific properties of the fused encoder beyond parity: thread-count independence,
// encoder reuse, and no hidden state between calls.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/pq.h"
#include "ops/ref/pq.h"

namespace vq {
namespace {

TEST(CpuPQ, SameCodesForAnyThreadCount) {
  const PQShape s{3000, 16, 8, 256, false};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(s.n) * 16 * 8), books(256 * 8);
  for (auto& v : x) v = nd(rng);
  for (auto& v : books) v = nd(rng);
  std::vector<uint16_t> a(size_t(s.n) * 16), b(a.size()), c(a.size());
  set_num_threads(1);
  cpu::pq_encode(s, x.data(), books.data(), a.data());
  set_num_threads(2);
  cpu::pq_encode(s, x.data(), books.data(), b.data());
  set_num_threads(3);
  cpu::pq_encode(s, x.data(), books.data(), c.data());
  set_num_threads(2);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
}

TEST(CpuPQ, EncoderReuseAndChunkedCallsAgree) {
  const PQShape s{500, 4, 16, 4096, true};
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(s.n) * 4 * 16), books(size_t(4) * 4096 * 16);
  for (auto& v : x) v = nd(rng);
  for (auto& v : books) v = nd(rng);
  const cpu::PQEncoder enc(s, books.data());
  EXPECT_EQ(enc.distance(), cpu::PQDistance::dot);  // k >= 1024 selects the |c|^2 - 2x.c form
  EXPECT_EQ(cpu::PQEncoder(PQShape{1, 4, 16, 256, true}, books.data()).distance(), cpu::PQDistance::direct);
  std::vector<uint16_t> whole(size_t(s.n) * 4), parts(whole.size());
  enc.encode(x.data(), s.n, whole.data());
  for (int64_t i = 0; i < s.n; i += 37)
    enc.encode(x.data() + i * 64, std::min<int64_t>(37, s.n - i), parts.data() + i * 4);
  EXPECT_EQ(whole, parts);
  // The encoder's extra memory is its transposed codebook only.
  EXPECT_LE(enc.bytes(), (size_t(4) * 4096 * 16 + size_t(4) * 4096) * sizeof(float) + 4096);
}

}  // namespace
}  // namespace vq
