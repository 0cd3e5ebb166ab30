#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "codec/calibration_check.h"
#include "codec/calibration_file.h"
#include "core/checksum.h"
#include "core/error.h"

namespace vq {
namespace {

Calibration make_calib(Granularity g) {
  Calibration c;
  c.n_layers = 3;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.key = {4, 6};
  c.value = {8, 5};
  c.granularity = g;
  c.kmeans_iters = 17;
  c.seed = 0x1234;
  c.n_calib_tokens = 999;
  c.model = "test-model";
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  c.layers.resize(3);
  for (auto& L : c.layers) {
    L.smoothing.resize(size_t(c.n_kv_heads) * c.head_dim);
    L.key_codebooks.resize(c.key_codebook_floats());
    L.value_codebooks.resize(c.value_codebook_floats());
    for (auto* v : {&L.key_codebooks, &L.value_codebooks})
      for (auto& f : *v) f = nd(rng);
    for (auto& f : L.smoothing) f = 0.5f + std::fabs(nd(rng));  // positive, as sqrt(max |K|)
  }
  return c;
}

std::string tmp_path(const std::string& name) {
  return std::string(::testing::TempDir()) + "vq_calib_" + std::to_string(::getpid()) + "_" + name;
}

std::vector<char> read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void write_all(const std::string& p, const std::vector<char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), std::streamsize(b.size()));
}

// The load must throw vq::Error whose message contains `needle`.
void expect_load_error(const std::string& path, const std::string& needle, const std::string& ctx) {
  try {
    (void)load_calibration(path);
    ADD_FAILURE() << ctx << ": loaded without error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << ctx << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << ctx << ": path missing: " << e.what();
  }
}

TEST(Calibration, RoundTrip) {
  for (Granularity g : {Granularity::shared, Granularity::per_subspace}) {
    const Calibration c = make_calib(g);
    const std::string p = tmp_path("rt");
    save_calibration(p, c);
    const Calibration d = load_calibration(p);
    EXPECT_EQ(d.n_layers, 3);
    EXPECT_EQ(d.n_kv_heads, 2);
    EXPECT_EQ(d.head_dim, 32);
    EXPECT_EQ(d.key.sub_dim, 4);
    EXPECT_EQ(d.key.bits, 6);
    EXPECT_EQ(d.value.sub_dim, 8);
    EXPECT_EQ(d.value.bits, 5);
    EXPECT_EQ(d.granularity, g);
    EXPECT_EQ(d.kmeans_iters, 17);
    EXPECT_EQ(d.seed, 0x1234u);
    EXPECT_EQ(d.n_calib_tokens, 999u);
    EXPECT_EQ(d.model, "test-model");
    ASSERT_EQ(d.layers.size(), 3u);
    for (int l = 0; l < 3; ++l) {
      EXPECT_EQ(d.layers[l].smoothing, c.layers[l].smoothing);
      EXPECT_EQ(d.layers[l].key_codebooks, c.layers[l].key_codebooks);
      EXPECT_EQ(d.layers[l].value_codebooks, c.layers[l].value_codebooks);
    }
    if (g == Granularity::per_subspace) {
      EXPECT_EQ(d.key_books(), 8);
    }
    std::remove(p.c_str());
  }
}

// Rewrites the trailing checksum so that an edited file is checksum-consistent (the attack the
// value bounds exist for: the checksum only catches accidents).
void fix_checksum(std::vector<char>& b) {
  const uint64_t sum = checksum64(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &sum, 8);
}

// Version 2 stores the held-out check; version 1 files (no check) still load, with the same data.
TEST(Calibration, HeldOutCheckRoundTripsAndVersion1And2FilesStillLoad) {
  Calibration c = make_calib(Granularity::per_subspace);
  c.check = {1024, 0.0412, 0.903, 1.033};
  const std::string p = tmp_path("check"), q = tmp_path("check_v1");
  save_calibration(p, c);
  const Calibration d = load_calibration(p);
  EXPECT_EQ(d.check.tokens, 1024u);
  EXPECT_EQ(d.check.kl, 0.0412);
  EXPECT_EQ(d.check.top1, 0.903);
  EXPECT_EQ(d.check.ppl_ratio, 1.033);
  // The same file as version 3 (no key transform: 4 bytes at offset 112), as version 2 (no key-mean
  // fields either: 12 bytes at offset 100, after the check) and as version 1 (no check either: 28
  // more bytes at offset 72, after n_calib_tokens).
  auto older = [&](uint32_t version) {
    auto b = read_all(p);
    size_t removed = 4;
    b.erase(b.begin() + 112, b.begin() + 116);
    if (version <= 2) {
      b.erase(b.begin() + 100, b.begin() + 112);
      removed += 12;
    }
    if (version == 1) {
      b.erase(b.begin() + 72, b.begin() + 100);
      removed += 28;
    }
    std::memcpy(b.data() + 8, &version, 4);
    uint32_t header_bytes;
    std::memcpy(&header_bytes, b.data() + 12, 4);
    header_bytes -= uint32_t(removed);
    std::memcpy(b.data() + 12, &header_bytes, 4);
    fix_checksum(b);
    write_all(q, b);
    return load_calibration(q);
  };
  const Calibration v3 = older(3);
  EXPECT_EQ(v3.check.kl, 0.0412);
  EXPECT_FALSE(v3.learned_keys());
  for (int l = 0; l < 3; ++l) EXPECT_EQ(v3.layers[size_t(l)].value_codebooks, c.layers[size_t(l)].value_codebooks);
  const Calibration v2 = older(2);
  EXPECT_EQ(v2.check.tokens, 1024u);
  EXPECT_EQ(v2.check.kl, 0.0412);
  EXPECT_FALSE(v2.has_key_mean());
  const Calibration e = older(1);
  EXPECT_EQ(e.check.tokens, 0u);
  EXPECT_EQ(e.model, "test-model");
  EXPECT_EQ(e.n_calib_tokens, 999u);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(e.layers[size_t(l)].key_codebooks, c.layers[size_t(l)].key_codebooks);
  // A check that cannot be a measurement is refused even with a valid checksum.
  struct Case { size_t at; double v; const char* needle; };
  for (const Case& k : {Case{76, std::nan(""), "held-out check kl = nan"}, Case{76, -1.0, "kl = -1"},
                        Case{84, 1.5, "top1 = 1.5"}, Case{92, 0.0, "ppl_ratio = 0"}}) {
    auto bad = read_all(p);
    std::memcpy(bad.data() + k.at, &k.v, 8);
    fix_checksum(bad);
    write_all(q, bad);
    expect_load_error(q, k.needle, k.needle);
  }
  std::remove(p.c_str());
  std::remove(q.c_str());
}

// A learned key transform (file version 4): the maps round-trip; a map that is not invertible, or
// the flag without maps, is refused with the layer and head named, even with a valid checksum.
TEST(Calibration, LearnedKeyMapsRoundTripAndBadOnesAreRefused) {
  Calibration c = make_calib(Granularity::per_subspace);
  c.key_transform = KeyTransform::learned;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const size_t D = size_t(c.head_dim);
  for (auto& L : c.layers) {
    L.key_map.assign(size_t(c.n_kv_heads) * D * D, 0.0f);
    for (size_t h = 0; h < size_t(c.n_kv_heads); ++h)
      for (size_t i = 0; i < D; ++i)
        for (size_t j = 0; j < D; ++j) L.key_map[(h * D + i) * D + j] = (i == j ? 2.0f : 0.0f) + 0.05f * nd(rng);
  }
  const std::string p = tmp_path("learned"), q = tmp_path("learned_bad");
  save_calibration(p, c);
  const Calibration d = load_calibration(p);
  EXPECT_TRUE(d.learned_keys());
  for (int l = 0; l < 3; ++l) EXPECT_EQ(d.layers[size_t(l)].key_map, c.layers[size_t(l)].key_map);
  // Layer 1, KV head 1: row 4 zeroed (singular). The maps are each layer's last array.
  const auto full = read_all(p);
  const size_t per_layer = (c.layers[0].smoothing.size() + c.key_codebook_floats() + c.value_codebook_floats() +
                            c.layers[0].key_map.size()) * 4;
  const size_t layer2 = full.size() - 8 - per_layer, map1 = layer2 - c.layers[0].key_map.size() * 4;
  auto b = full;
  for (size_t j = 0; j < D; ++j) std::memset(b.data() + map1 + ((D + 4) * D + j) * 4, 0, 4);
  fix_checksum(b);
  write_all(q, b);
  expect_load_error(q, "layer 1 KV head 1: the key map is singular", "singular map");
  b = full;
  const float big = 1e30f;
  std::memcpy(b.data() + map1 + 12, &big, 4);
  fix_checksum(b);
  write_all(q, b);
  expect_load_error(q, "layer 1 key map[0, 0, 3] = 1e+30 is not finite or exceeds the bound", "a huge entry");
  // The flag without maps (in memory) and maps without the flag.
  Calibration bad = c;
  bad.layers[2].key_map.clear();
  EXPECT_THROW(save_calibration(q, bad), Error);
  bad = make_calib(Granularity::per_subspace);
  bad.layers[0].key_map = c.layers[0].key_map;
  try {
    save_calibration(q, bad);
    ADD_FAILURE() << "saved a key map of a Walsh-Hadamard calibration";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 holds a key map but the key transform is hadamard"),
              std::string::npos) << e.what();
  }
  std::remove(p.c_str());
  std::remove(q.c_str());
}

TEST(Calibration, TruncationAtManyOffsets) {
  const std::string p = tmp_path("trunc");
  save_calibration(p, make_calib(Granularity::shared));
  const auto full = read_all(p);
  const std::string q = tmp_path("trunc_cut");
  std::vector<size_t> cuts = {0, 1, 7, 8, 11, 12, 20, 40, 60, 80, 90, full.size() / 2, full.size() - 9,
                              full.size() - 8, full.size() - 1};
  for (size_t c = 100; c < full.size(); c += 997) cuts.push_back(c);
  for (size_t cut : cuts) {
    write_all(q, std::vector<char>(full.begin(), full.begin() + int64_t(cut)));
    expect_load_error(q, "", "cut at " + std::to_string(cut));
    try {
      (void)load_calibration(q);
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("truncated") != std::string::npos || m.find("magic") != std::string::npos)
          << "cut " << cut << ": " << m;
    }
  }
  // Trailing garbage is also an error.
  auto longer = full;
  longer.push_back(0);
  write_all(q, longer);
  expect_load_error(q, "trailing", "trailing byte");
  std::remove(p.c_str());
  std::remove(q.c_str());
}

TEST(Calibration, FlippedBytes) {
  const std::string p = tmp_path("flip");
  save_calibration(p, make_calib(Granularity::per_subspace));
  const auto full = read_all(p);
  const std::string q = tmp_path("flip_bad");
  std::mt19937 rng(3);
  std::vector<size_t> offs = {0, 5, 8, 12, 16, 40, 70, full.size() - 1, full.size() - 8};
  for (int i = 0; i < 40; ++i) offs.push_back(rng() % full.size());
  for (size_t off : offs) {
    auto bad = full;
    bad[off] = char(bad[off] ^ (1 << (rng() % 8)));
    write_all(q, bad);
    expect_load_error(q, "", "flip at " + std::to_string(off));
  }
  // A flipped payload byte is caught by the checksum.
  auto bad = full;
  bad[full.size() - 20] ^= 0x10;
  write_all(q, bad);
  expect_load_error(q, "checksum", "payload flip");
  std::remove(p.c_str());
  std::remove(q.c_str());
}

TEST(Calibration, WrongMagicAndVersion) {
  const std::string p = tmp_path("magic");
  save_calibration(p, make_calib(Granularity::shared));
  auto b = read_all(p);
  auto m = b;
  m[0] = 'X';
  write_all(p, m);
  expect_load_error(p, "magic", "magic");
  auto v = b;
  v[8] = 5;  // version field, little-endian u32 at offset 8
  write_all(p, v);
  expect_load_error(p, "version 5", "version");
  v[8] = 0;
  write_all(p, v);
  expect_load_error(p, "version 0", "version 0");
  std::remove(p.c_str());
  expect_load_error(p, "cannot open", "missing file");
}

TEST(Calibration, GeometryMismatchAndInvalidData) {
  const Calibration c = make_calib(Granularity::shared);
  EXPECT_NO_THROW(check_calibration_geometry(c, 3, 2, 32));
  EXPECT_THROW(check_calibration_geometry(c, 4, 2, 32), Error);
  EXPECT_THROW(check_calibration_geometry(c, 3, 1, 32), Error);
  try {
    check_calibration_geometry(c, 3, 2, 64);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
  Calibration bad = c;
  bad.layers[1].key_codebooks.pop_back();
  EXPECT_THROW(save_calibration(tmp_path("bad"), bad), Error);
  bad = c;
  bad.key.bits = 13;
  EXPECT_THROW(save_calibration(tmp_path("bad"), bad), Error);
  bad = c;
  bad.value.sub_dim = 3;
  EXPECT_THROW(save_calibration(tmp_path("bad"), bad), Error);
  bad = c;
  bad.head_dim = 36;  // not Hadamard-friendly
  EXPECT_THROW(save_calibration(tmp_path("bad"), bad), Error);
  // The header geometry disagreeing with the payload (here: head_dim edited, checksum intact
  // would not be; we edit and expect a clear error either way).
  const std::string p = tmp_path("geom");
  save_calibration(p, c);
  auto b = read_all(p);
  b[16 + 8] = 64;  // head_dim field (magic 8, version 4, header_bytes 4, n_layers 4, n_kv 4)
  write_all(p, b);
  expect_load_error(p, "", "edited head_dim");
  std::remove(p.c_str());
}

TEST(Calibration, OutOfBoundValuesAreRefusedEvenWithAValidChecksum) {
  const Calibration c = make_calib(Granularity::per_subspace);
  const std::string p = tmp_path("values"), q = tmp_path("values_bad");
  save_calibration(p, c);
  const auto full = read_all(p);
  // The payload starts after the header; layer 0 holds smoothing [2, 32], then key codebooks.
  const size_t header = full.size() - 8 - size_t(c.n_layers) * (64 + c.key_codebook_floats() + c.value_codebook_floats()) * 4;
  const size_t key0 = header + 64 * 4, value0 = key0 + c.key_codebook_floats() * 4;
  struct Case { size_t at; float v; const char* needle; };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const Case& k : {Case{key0 + 4 * 37, 1e30f, "layer 0 key codebooks[0, 0, 9, 1] = 1e+30"},
                        Case{key0, nan, "layer 0 key codebooks[0, 0, 0, 0] = nan"},
                        Case{value0 + 8, -inf, "layer 0 value codebooks[0, 0, 0, 2] = -inf"},
                        Case{value0, 70000.0f, "exceeds the bound 65504"},
                        Case{header + 4 * 33, 0.0f, "layer 0 smoothing[1, 1] = 0 must be in [0.001, 65504]"},
                        Case{header, -2.0f, "smoothing[0, 0] = -2"}}) {
    auto b = full;
    std::memcpy(b.data() + k.at, &k.v, 4);
    fix_checksum(b);
    write_all(q, b);
    expect_load_error(q, k.needle, k.needle);
    expect_load_error(q, q + ": calibration: layer 0", "the message names the file");
  }
  // In memory: save refuses the same values.
  Calibration bad = c;
  bad.layers[2].value_codebooks[5] = 1e9f;
  try {
    save_calibration(tmp_path("never"), bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 2 value codebooks"), std::string::npos) << e.what();
  }
  // The bound itself is accepted.
  bad = c;
  bad.layers[0].key_codebooks[0] = -65504.0f;
  bad.layers[0].smoothing[0] = 65504.0f;
  EXPECT_NO_THROW(save_calibration(q, bad));
  std::remove(p.c_str());
  std::remove(q.c_str());
}

TEST(Calibration, MatchesTheCacheSpecAndTheModel) {
  const Calibration c = make_calib(Granularity::per_subspace);  // k d4b6, v d8b5, 3 layers, 2 x 32
  KVCacheConfig cfg;
  cfg.method = KVMethod::vecinfer;
  cfg.key = {4, 6};
  cfg.value = {8, 5};
  cfg.granularity = CodebookGranularity::per_subspace;
  const KVGeometry g{4, 2, 32};
  EXPECT_NO_THROW(check_calibration_matches(c, cfg, g, 3));
  auto expect_msg = [&](const KVCacheConfig& k, const KVGeometry& gg, int layers, const std::string& needle) {
    try {
      check_calibration_matches(c, k, gg, layers);
      ADD_FAILURE() << "no error, wanted " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg(cfg, g, 4, "n_layers = 3 but the model has 4");
  expect_msg(cfg, {4, 4, 32}, 3, "n_kv_heads = 2 but the model has 4");
  expect_msg(cfg, {4, 2, 64}, 3, "head_dim = 32 but the model has 64");
  KVCacheConfig k = cfg;
  k.key = {4, 8};
  expect_msg(k, g, 3, "key codebooks are d4b6 but the cache spec asks for k=d4b8 (make a matching file with `veloxquant calibrate --kv-cache vecinfer:k=d4b8,v=d8b5,gran=per_subspace`)");
  k = cfg;
  k.value = {4, 5};
  expect_msg(k, g, 3, "value codebooks are d8b5");
  k = cfg;
  k.granularity = CodebookGranularity::shared;  // gran=shared with a per-subspace file
  expect_msg(k, g, 3, "granularity is per_subspace but the cache spec says gran=shared");
  k = cfg;
  k.method = KVMethod::q8_0;
  expect_msg(k, g, 3, "only a vecinfer kv cache uses a calibration");
  const Calibration s = make_calib(Granularity::shared);
  try {
    check_calibration_matches(s, cfg, g, 3);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("granularity is shared but the cache spec says gran=per_subspace"),
              std::string::npos) << e.what();
  }
}

TEST(Calibration, AtomicWriteLeavesNoTemp) {
  const std::string dir = ::testing::TempDir();
  const std::string p = tmp_path("atomic");
  save_calibration(p, make_calib(Granularity::shared));
  std::ifstream tmp(p + ".tmp." + std::to_string(::getpid()));
  EXPECT_FALSE(tmp.good());
  std::remove(p.c_str());
}

}  // namespace
}  // namespace vq

// Issue 26: the model a calibration records is compared with the model's file name (with or
// without ".gguf") and general.name; a file whose name was changed is refused naming both.
TEST(Calibration, RecordedModelMustBeThisModel) {
  vq::Calibration c;
  c.model = "SmolLM2-135M-Instruct.Q4_1.gguf";
  EXPECT_NO_THROW(vq::check_calibration_model(c, "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2 135M Instruct"));
  c.model = "SmolLM2-135M-Instruct.Q4_1";
  EXPECT_NO_THROW(vq::check_calibration_model(c, "SmolLM2-135M-Instruct.Q4_1.gguf", ""));
  c.model = "SmolLM2 135M Instruct";  // a renamed copy of the file: its general.name still matches
  EXPECT_NO_THROW(vq::check_calibration_model(c, "copy.gguf", "SmolLM2 135M Instruct"));
  c.model = "Llama-3-8B.gguf";
  try {
    vq::check_calibration_model(c, "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2 135M Instruct");
    ADD_FAILURE() << "a calibration of another model was accepted";
  } catch (const vq::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("made for model 'Llama-3-8B.gguf'"), std::string::npos) << m;
    EXPECT_NE(m.find("SmolLM2-135M-Instruct.Q4_1.gguf"), std::string::npos) << m;
  }
  c.model = "";
  EXPECT_THROW(vq::check_calibration_model(c, "m.gguf", ""), vq::Error);  // nothing recorded: not this model
}
