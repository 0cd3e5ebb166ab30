// Single-thread speed of attention on VecInfer codes (vq::cpu::pq_attention_accumulate with a
// prebuilt LUT, the cache's decode path) against the reference LUT kernel, on random codes:
// ns and cycles (at the measured TSC-free clock estimate, see below) per token x KV head for
// the whole GQA group. Calls cover `chunk` tokens each, as the cache's pages do.
// usage: kv_speed_pq [n_tokens=8192] [group=3] [chunk=512] [head_dim=64] [preset ...] (presets: d4b8 d8b8 d8b12 ...)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/bitpack.h"
#include "core/buffer.h"
#include "ops/cpu/pq_attention.h"
#include "ops/ref/pq_attention.h"

using namespace vq;
using Clock = std::chrono::steady_clock;

namespace {

bool parse_preset(const std::string& s, int& sd, int& bits) {
  return std::sscanf(s.c_str(), "d%db%d", &sd, &bits) == 2 && sd > 0 && bits > 0 && bits <= 16;
}

void run(int n, int G, int chunk, int D, const std::string& kp, const std::string& vp) {
  int ksd, kb, vsd, vb;
  if (!parse_preset(kp, ksd, kb) || !parse_preset(vp, vsd, vb)) {
    std::printf("bad preset %s/%s\n", kp.c_str(), vp.c_str());
    return;
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  const int nks = D / ksd, nvs = D / vsd;
  // per-subspace codebooks: k [nks, 2^kb, ksd], v [nvs, 2^vb, vsd] f32
  std::vector<float> kcb((size_t(nks) << kb) * ksd), vcb((size_t(nvs) << vb) * vsd), q(size_t(G) * D);
  for (auto& x : kcb) x = nd(rng);
  for (auto& x : vcb) x = nd(rng);
  for (auto& x : q) x = 0.1f * nd(rng);
  const size_t kr = packed_row_bytes(nks, kb), vr = packed_row_bytes(nvs, vb);
  // codes: k [n, kr], v [n, vr] bytes
  AlignedBuffer<uint8_t> kc(kr * size_t(n)), vc(vr * size_t(n));
  std::vector<uint16_t> codes(static_cast<size_t>(D));
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < nks; ++j) codes[size_t(j)] = uint16_t(rng() & ((1u << kb) - 1));
    pack_codes(codes.data(), nks, kb, kc.data() + size_t(t) * kr);
    for (int j = 0; j < nvs; ++j) codes[size_t(j)] = uint16_t(rng() & ((1u << vb) - 1));
    pack_codes(codes.data(), nvs, vb, vc.data() + size_t(t) * vr);
  }
  PQAttnArgs a;
  a.group = G; a.head_dim = D;
  a.k_sub_dim = ksd; a.k_bits = kb; a.k_books = nks;
  a.v_sub_dim = vsd; a.v_bits = vb; a.v_books = nvs;
  a.q = q.data(); a.k_codebook = kcb.data(); a.v_codebook = vcb.data();
  std::vector<float> m(static_cast<size_t>(G)), d(static_cast<size_t>(G)), o(size_t(G) * D);
  a.m = m.data(); a.d = d.data(); a.o = o.data();
  const auto cbt = cpu::transpose_codebook(kcb.data(), nks, kb, ksd);
  std::vector<float> lut(cpu::pq_lut_floats(a));
  auto once = [&] {
    std::fill(m.begin(), m.end(), -INFINITY);
    std::fill(d.begin(), d.end(), 0.0f);
    std::fill(o.begin(), o.end(), 0.0f);
    cpu::pq_build_lut(a, cbt.data(), lut.data());
    for (int t0 = 0; t0 < n; t0 += chunk) {
      a.n_tokens = std::min(chunk, n - t0);
      a.k_codes = kc.data() + size_t(t0) * kr;
      a.v_codes = vc.data() + size_t(t0) * vr;
      cpu::pq_attention_accumulate(a, lut.data());
    }
  };
  once();
  double best = 1e30;
  for (int r = 0; r < 15; ++r) {
    const auto t0 = Clock::now();
    once();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  // check against the reference on the same codes (whole range in one call)
  std::vector<float> rm(static_cast<size_t>(G)), rd(static_cast<size_t>(G)), ro(size_t(G) * D);
  PQAttnArgs r = a;
  r.n_tokens = n; r.k_codes = kc.data(); r.v_codes = vc.data();
  r.m = rm.data(); r.d = rd.data(); r.o = ro.data();
  const auto r0 = Clock::now();
  ref::pq_attention(r);
  const double ref_s = std::chrono::duration<double>(Clock::now() - r0).count();
  double num = 0, den = 0;
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < D; ++c) {
      const double x = o[size_t(g) * D + c] / d[size_t(g)] * std::exp(double(m[size_t(g)]) - rm[size_t(g)]) * rd[size_t(g)];
      const double y = ro[size_t(g) * D + c];
      num += (x - y) * (x - y);
      den += y * y;
    }
  const double ns_tok = best * 1e9 / n;
  std::printf("k=%-6s v=%-6s D=%d G=%d n=%d chunk=%d: %.2f ns/token-kvhead (%.1f us per call set), ref %.1f ns/token; "
              "code bytes/token %zu; nmse vs ref %.1e\n",
              kp.c_str(), vp.c_str(), D, G, n, chunk, ns_tok, best * 1e6, ref_s * 1e9 / n, kr + vr, den > 0 ? num / den : num);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 8192, G = 3, chunk = 512, D = 64;
  std::vector<std::string> presets;
  int pos = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) {
      const int v = std::atoi(s.c_str());
      if (pos == 0) n = v;
      else if (pos == 1) G = v;
      else if (pos == 2) chunk = v;
      else D = v;
      ++pos;
    } else {
      presets.push_back(s);
    }
  }
  if (presets.empty()) presets = {"d4b8", "d8b8", "d8b12"};
  for (const auto& p : presets) {
    const auto slash = p.find('/');
    if (slash == std::string::npos) run(n, G, chunk, D, p, p);
    else run(n, G, chunk, D, p.substr(0, slash), p.substr(slash + 1));
  }
}
