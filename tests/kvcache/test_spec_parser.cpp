// The KV cache spec parser accepts exactly what the caches and codecs accept, refuses options
// that do not apply to the chosen method, and its help text lists the syntax it parses.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "codec/product_quantizer.h"
#include "common/error_of.h"
#include "kvcache/factory.h"
#include "kvcache/spec_syntax.h"

namespace vq {
namespace {

using test::error_of;

std::string spec_error(const std::string& spec) {
  return error_of([&] { parse_kv_cache_spec(spec); });
}

TEST(SpecParser, OptionsThatDoNotApplyAreErrors) {
  for (const char* spec : {"fp16,r=64", "fp32,r=1", "q8_0,r=64", "q4_0:r=0", "kivi2,sink=4", "q8_0,sink=1",
                           "fp16,sinks=1", "fp16,g=32", "q4_0,group=32", "vecinfer:d4b8,g=32", "fp16,gran=shared",
                           "kivi4,gran=shared", "q8_0,granularity=per_subspace", "kivi2,b=4", "kivi4,bits=2",
                           "vecinfer:d4b8,b=4", "fp16,k=d4b8", "q8_0:d4b8", "kivi2:v=d4b8"}) {
    const std::string e = spec_error(spec);
    EXPECT_NE(e.find("does not apply to"), std::string::npos) << spec << ": " << (e.empty() ? "accepted" : e);
    EXPECT_NE(e.find(spec), std::string::npos) << "the message names the spec: " << e;
  }
  // ... while the same options are taken by the methods they belong to.
  EXPECT_EQ(parse_kv_cache_spec("kivi2,r=64,g=16").residual_length, 64);
  EXPECT_EQ(parse_kv_cache_spec("kivi,b=4").kivi_bits, 4);
  EXPECT_EQ(parse_kv_cache_spec("vecinfer:d4b8,r=0,sink=0,gran=shared").sink_tokens, 0);
  EXPECT_EQ(parse_kv_cache_spec("q8_0,gpu=forbid").use_gpu_kernels, GpuKernels::forbid);
}

// Property: for every preset the grammar can express, the parser accepts it exactly when the
// product quantizer (what the cache builds from it) does. Before, d1b8 or d4b16 parsed and the
// cache failed only once the model had loaded.
TEST(SpecParser, PresetsAreExactlyWhatTheCodecAccepts) {
  int accepted = 0;
  for (int d = 1; d <= 64; ++d)
    for (int b = 1; b <= 16; ++b) {
      const std::string preset = fmt::format("d{}b{}", d, b);  // (GCC 12 warns falsely on the + chain)
      const bool parses = spec_error("vecinfer:" + preset).empty();
      bool codec = true;
      try {
        ProductQuantizer(16 * d, CodecParams{d, b}, Granularity::per_subspace);
      } catch (const Error&) {
        codec = false;
      }
      EXPECT_EQ(parses, codec) << preset;
      accepted += parses;
    }
  EXPECT_EQ(accepted, 4 * 9);  // sub_dim 2, 4, 8, 16 x bits 4..12
  EXPECT_NE(spec_error("vecinfer:k=d4b8,v=d4b13").find("value.bits: 13 must be in 4..12"), std::string::npos);
  EXPECT_NE(spec_error("vecinfer:d3b8").find("key.sub_dim: 3 must be 2, 4, 8 or 16"), std::string::npos);
}

TEST(SpecParser, ModelChecksNameTheField) {
  KVCacheConfig v = parse_kv_cache_spec("vecinfer:d16b8");
  EXPECT_NE(error_of([&] { v.validate(40); }).find("key.sub_dim: 16 does not divide the model's head_dim 40"),
            std::string::npos);
  v = parse_kv_cache_spec("vecinfer:d4b8");
  // 36 = 4 x 9: no power-of-two block of at least 8 for the Hadamard rotation.
  EXPECT_NE(error_of([&] { v.validate(36); }).find("vecinfer cannot rotate the keys"), std::string::npos);
  EXPECT_EQ(error_of([&] { v.validate(64); }), "");
  EXPECT_NE(error_of([&] { parse_kv_cache_spec("q8_0").validate(48); }).find("block of 32"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_kv_cache_spec("kivi2,g=64").validate(96); }).find("kivi_group: 64 must divide"),
            std::string::npos);
}

TEST(SpecParser, RepeatsAndEmptyOptionsAreErrors) {
  EXPECT_NE(spec_error("vecinfer:d4b8,r=1,r=2").find("option 'r' given twice"), std::string::npos);
  EXPECT_NE(spec_error("vecinfer:d4b8,residual=1,r=2").find("option 'r' given twice"), std::string::npos);
  EXPECT_NE(spec_error("vecinfer:d4b8,k=d8b8").find("the key preset given twice"), std::string::npos);
  EXPECT_NE(spec_error("vecinfer:k=d4b8,d8b8").find("given twice"), std::string::npos);
  EXPECT_NE(spec_error("kivi2,,r=4").find("empty option"), std::string::npos);
  EXPECT_NE(spec_error("kivi2,r=4,").find("empty option"), std::string::npos);
  EXPECT_NE(spec_error("vecinfer:d4b8,zz=1").find("unknown option 'zz=1'"), std::string::npos);
  EXPECT_NE(spec_error("vecinfer:d4b8,r=12x").find("'12x' is not an integer"), std::string::npos);
}

TEST(SpecParser, SyntaxHelpListsEveryFormAndItsExamplesParse) {
  const std::string help = kv_cache_spec_syntax();
  for (const char* part : {"fp16", "fp32", "q8_0", "q4_0", "kivi2", "kivi4", "kivi,b=2|4", "vecinfer:dDbB",
                           "vecinfer:k=dDbB,v=dDbB", "g=N", "r=N", "sink=N", "gran=shared|per_subspace",
                           "gpu=auto|require|forbid", "4..12", "2, 4, 8 or 16"})
    EXPECT_NE(help.find(part), std::string::npos) << part;
  const size_t ex = help.find("examples:");
  ASSERT_NE(ex, std::string::npos);
  std::istringstream in(help.substr(ex + 9));
  std::string spec;
  int n = 0;
  while (in >> spec) {
    EXPECT_EQ(spec_error(spec), "") << spec;
    ++n;
  }
  EXPECT_GE(n, 4);
}

}  // namespace
}  // namespace vq
