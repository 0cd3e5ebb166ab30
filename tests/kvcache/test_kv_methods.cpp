// The KV method registry (kvcache/kv_method.h): every method is registered once and describes
// itself consistently; spec shorthands mean one documented thing or are refused naming the bad
// part (issue 26 item 5); q5_0, the method added only through the registry
// (docs/HOWTO-add-a-kv-method.md), against the fp32 reference attention.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "kvcache/factory.h"
#include "kvcache/kv_method.h"
#include "kvcache/kv_store_device.h"
#include "kvcache/pooled_cache.h"
#include "kvcache/spec_syntax.h"
#include "ops/ref/attention.h"
#include "test_util.h"

namespace vq {
namespace {

using test::error_of;

std::string spec_error(const std::string& spec) {
  return error_of([&] { parse_kv_cache_spec(spec); });
}

TEST(KVMethods, EachRegisteredOnceAndSelfConsistent) {
  std::set<int> ids;
  std::set<std::string> names, heads;
  const std::string help = kv_cache_spec_syntax();
  for (const KVMethodDef* m : kv_methods()) {
    EXPECT_TRUE(ids.insert(int(m->id())).second) << m->name() << ": id registered twice";
    EXPECT_TRUE(names.insert(m->name()).second) << m->name();
    EXPECT_EQ(&kv_method(m->id()), m);
    EXPECT_EQ(std::string(method_name(m->id())), m->name());
    for (const std::string& h : m->heads()) {
      EXPECT_TRUE(heads.insert(h).second) << "head " << h << " answered by two methods";
      EXPECT_EQ(find_kv_method_by_head(h), m) << h;
    }
    EXPECT_NE(help.find(m->name()), std::string::npos) << m->name() << " is missing from the spec help";
    EXPECT_FALSE(m->windowed() && m->direct()) << m->name();
    // Every preset parses to this method, prints canonically (the name parses back to the same
    // config) and states its bits.
    for (const std::string& p : m->presets()) {
      const KVCacheConfig c = parse_kv_cache_spec(p);
      EXPECT_EQ(c.method, m->id()) << p;
      EXPECT_EQ(parse_kv_cache_spec(c.name()).name(), c.name()) << p;
      EXPECT_GT(c.nominal_bits_per_element(), 0.0) << p;
      // A format exists exactly for the compressed methods (fp16/fp32 are dense only).
      const bool coded = m->windowed() || m->direct();
      if (!m->needs_calibration()) {
        EXPECT_EQ(make_coded_format(c, nullptr, 0, KVGeometry{4, 2, 64}, m->default_block_tokens(c)) != nullptr, coded)
            << p;
      }
    }
    for (const std::string& e : m->examples()) EXPECT_EQ(spec_error(e), "") << e;
  }
  // Every value of the public enum is registered (the enum's last value is q5_0).
  for (int i = 0; i <= int(KVMethod::q5_0); ++i) EXPECT_TRUE(ids.count(i)) << "KVMethod " << i << " not registered";
}

// The lists that drifted before (issue 19): the help, eval's list and the device check all come
// from the registry now; q4_0h is in each.
TEST(KVMethods, ListsComeFromTheRegistry) {
  const std::vector<std::string> all = kv_method_presets(), evaluated = kv_method_presets(true);
  for (const char* p : {"fp16", "fp32", "q8_0", "q4_0", "q4_0h", "q5_0", "kivi2", "kivi4", "vecinfer:d4b8"})
    EXPECT_NE(std::find(all.begin(), all.end(), p), all.end()) << p;
  EXPECT_NE(std::find(evaluated.begin(), evaluated.end(), "q4_0h"), evaluated.end());
  EXPECT_EQ(std::find(evaluated.begin(), evaluated.end(), "fp32"), evaluated.end());
  EXPECT_NE(kv_cache_spec_syntax().find("q4_0h"), std::string::npos);
  EXPECT_EQ(kv_device_method_names(), "fp16, q8_0, q4_0, q4_0h, q5_0 and vecinfer");
  const std::string why = kv_device_unsupported_reason(KVSpec{parse_kv_cache_spec("kivi2"), nullptr}, KVGeometry{8, 2, 64}, 32);
  EXPECT_NE(why, "");
  // A direct method runs on the device only through a scalar block type the device knows.
  for (const KVMethodDef* m : kv_methods()) {
    if (m->has_device_format() && m->direct()) {
      EXPECT_NE(int(m->device_scalar().blocks), int(DeviceScalarBlocks::none)) << m->name();
    }
  }
  // Every method without device kernels states why, and the device's refusal quotes it (the one
  // place: its registry entry).
#ifdef VQ_HAVE_CUDA
  for (const KVMethodDef* m : kv_methods()) {
    if (m->has_device_format()) continue;
    EXPECT_FALSE(m->device_why_not().empty()) << m->name();
    const std::string r =
        kv_device_unsupported_reason(KVSpec{parse_kv_cache_spec(m->presets().front()), nullptr}, KVGeometry{8, 2, 64}, 32);
    EXPECT_NE(r.find(m->device_why_not()), std::string::npos) << m->name() << ": " << r;
    EXPECT_NE(r.find("--device cpu"), std::string::npos) << r;
  }
#endif
}

// Issue 26 item 5: `vecinfer`, `vecinfer:` and `vecinfer:k=d4b8` silently became defaults.
TEST(KVMethods, ShorthandsMeanTheDocumentedDefaultOrAreRefused) {
  // A method alone is its documented default preset, and the help says which.
  EXPECT_EQ(parse_kv_cache_spec("vecinfer").name(), "vecinfer:d4b8");
  // shared books are a different cache from per-sub-space ones: the name says so and parses back
  EXPECT_EQ(parse_kv_cache_spec("vecinfer:d4b8,gran=shared").name(), "vecinfer:d4b8,gran=shared");
  EXPECT_EQ(parse_kv_cache_spec(parse_kv_cache_spec("vecinfer:d4b8,gran=shared").name()).granularity,
            CodebookGranularity::shared);
  EXPECT_EQ(parse_kv_cache_spec("vecinfer:d4b8,gran=per_subspace").name(), "vecinfer:d4b8");
  EXPECT_NE(kv_cache_spec_syntax().find("vecinfer alone = vecinfer:d4b8"), std::string::npos);
  EXPECT_EQ(parse_kv_cache_spec("kivi").name(), "kivi2");
  EXPECT_NE(kv_cache_spec_syntax().find("kivi alone = kivi2"), std::string::npos);
  // An empty option list after ':' (or ',') is refused, naming what is missing.
  for (const char* s : {"vecinfer:", "kivi2:", "fp16:", "vecinfer,", "q5_0:"}) {
    const std::string e = spec_error(s);
    EXPECT_NE(e.find("nothing after"), std::string::npos) << s << ": " << (e.empty() ? "accepted" : e);
    EXPECT_NE(e.find(std::string("'") + s + "'"), std::string::npos) << e;
  }
  // One preset side without the other is refused (it used to leave the other at the default).
  for (const char* s : {"vecinfer:k=d4b8", "vecinfer:v=d8b8,r=64"}) {
    const std::string e = spec_error(s);
    EXPECT_NE(e.find("given without"), std::string::npos) << s << ": " << (e.empty() ? "accepted" : e);
  }
  EXPECT_EQ(spec_error("vecinfer:k=d4b8,v=d8b8"), "");
  // Unknown keys are refused naming the option; unknown methods naming the method.
  EXPECT_NE(spec_error("vecinfer:kk=d4b8").find("unknown option 'kk=d4b8'"), std::string::npos);
  EXPECT_NE(spec_error("vecinfer:x=1").find("unknown option 'x=1'"), std::string::npos);
  EXPECT_NE(spec_error("q6_0").find("unknown method 'q6_0'"), std::string::npos);
  EXPECT_NE(spec_error("q5_0,r=8").find("option 'r=8' does not apply to q5_0"), std::string::npos);
}

double q5_nmse(const char* spec, std::mt19937& rng) {
  const int HQ = 8, H = 2, D = 64, n = 300, nq = 3;
  auto cache = make_kv_cache_factory(parse_kv_cache_spec(spec))(0, KVGeometry{HQ, H, D});
  auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
  for (int done = 0; done < n; done += 70) {
    const int m = std::min(70, n - done);
    cache->append(k.data() + size_t(done) * H * D, v.data() + size_t(done) * H * D, m);
  }
  auto q = randn(size_t(nq) * HQ * D, rng, 0.5f);
  std::vector<float> out(q.size()), ref_out(q.size());
  cache->attend(q.data(), nq, 0.125f, out.data());
  ref::attention(q.data(), nq, k.data(), v.data(), n, HQ, H, D, 0.125f, ref_out.data());
  return nmse(out, ref_out);
}

// q5_0 sits between q4_0 and q8_0: its step amax/16 is half q4_0's (amax/8), so its error is
// about a quarter of q4_0's; a broken code path (wrong nibble or high bit) gives NMSE ~ 1.
TEST(KVMethods, Q50AttendsBetweenQ40AndQ80) {
  std::mt19937 rng(7);
  const double e5 = q5_nmse("q5_0", rng);
  std::mt19937 rng4(7), rng8(7);
  const double e4 = q5_nmse("q4_0", rng4), e8 = q5_nmse("q8_0", rng8);
  std::printf("[ q5_0 ] attention NMSE vs fp32: %.5f (q4_0 %.5f, q8_0 %.6f)\n", e5, e4, e8);
  EXPECT_LT(e5, 0.5 * e4);
  EXPECT_GT(e5, e8);
  EXPECT_LT(e5, 0.02);
  const KVCacheConfig c = parse_kv_cache_spec("q5_0");
  EXPECT_EQ(c.method, KVMethod::q5_0);
  EXPECT_DOUBLE_EQ(c.nominal_bits_per_element(), 5.5);
  // Direct: every token is coded on append; 22 bytes per 32 elements.
  auto cp = make_kv_cache_factory(c)(0, KVGeometry{4, 2, 64});
  std::vector<float> x(size_t(40) * 2 * 64, 0.25f);
  cp->append(x.data(), x.data(), 40);
  EXPECT_EQ(static_cast<PooledCache&>(*cp).coded_tokens(), 40);
  EXPECT_EQ(static_cast<PooledCache&>(*cp).token_bytes(), size_t(40) * 2 * 2 * 2 * 22);
  EXPECT_NE(error_of([] { parse_kv_cache_spec("q5_0").validate(48); }).find("block of 32"), std::string::npos);
}

// Exactly representable inputs round-trip: a block whose values are integer multiples of d with
// q in 0..31 (max magnitude at -16 d) is coded without error, through the cache's attention.
TEST(KVMethods, Q50ExactOnItsGrid) {
  const int D = 32;
  std::vector<float> k(D), v(D);
  for (int j = 0; j < D; ++j) {
    k[j] = float((j * 7) % 32 - 16) * 0.125f;  // includes -16 * 0.125 = -2, the block max
    v[j] = float((j * 5) % 32 - 16) * 0.25f;
  }
  auto cache = make_kv_cache_factory(parse_kv_cache_spec("q5_0"))(0, KVGeometry{1, 1, D});
  cache->append(k.data(), v.data(), 1);
  std::vector<float> q(D, 0.1f), out(D);
  cache->attend(q.data(), 1, 1.0f, out.data());
  for (int j = 0; j < D; ++j) EXPECT_FLOAT_EQ(out[j], v[j]) << j;  // one token: the output is its value
}

}  // namespace
}  // namespace vq
