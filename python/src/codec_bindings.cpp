// ProductQuantizer and Calibration: NumPy arrays in and out.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common.h"
#include "veloxquant/calibration.h"
#include "veloxquant/codec.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"

namespace vqpy {

using veloxquant::Calibration;
using veloxquant::CodebookGranularity;
using veloxquant::ProductQuantizer;

static CodebookGranularity granularity_of(const std::string& g) {
  if (g == "shared") return CodebookGranularity::shared;
  if (g == "per_subspace") return CodebookGranularity::per_subspace;
  throw veloxquant::Error("granularity: '" + g + "' must be 'shared' or 'per_subspace'");
}
static const char* granularity_name(CodebookGranularity g) {
  return g == CodebookGranularity::shared ? "shared" : "per_subspace";
}

// Rows of x, checked against the quantizer's dim.
static size_t rows(const ProductQuantizer& pq, size_t cols, size_t n, const char* what) {
  if (cols != size_t(pq.dim()))
    throw veloxquant::Error(std::string(what) + ": arrays of " + std::to_string(cols) + " columns, the quantizer's dim is " +
                            std::to_string(pq.dim()));
  return n;
}

static void bind_pq(nb::module_& m) {
  nb::class_<ProductQuantizer>(m, "ProductQuantizer",
                               "Product quantizer on float32 vectors of `dim` elements: n_sub = dim / sub_dim "
                               "sub-vectors, each coded as the index of its nearest centroid among 2**bits.")
      .def(
          "__init__",
          [](ProductQuantizer* self, int dim, int sub_dim, int bits, const std::string& granularity) {
            new (self) ProductQuantizer(dim, {sub_dim, bits}, granularity_of(granularity));
          },
          nb::arg("dim"), nb::arg("sub_dim") = 4, nb::arg("bits") = 8, nb::arg("granularity") = "per_subspace",
          "sub_dim in {2, 4, 8, 16}, bits in 4..12, dim a multiple of sub_dim; granularity 'per_subspace' (one "
          "codebook per sub-space) or 'shared'.")
      .def_static(
          "from_codebooks",
          [](In<float, 3> books, int dim, const std::string& granularity) {
            const int sub_dim = int(books.shape(2));
            int bits = 0;
            while ((size_t(1) << bits) < books.shape(1)) ++bits;
            if ((size_t(1) << bits) != books.shape(1))
              throw veloxquant::Error("from_codebooks: " + std::to_string(books.shape(1)) +
                                      " centroids per codebook is not a power of two");
            ProductQuantizer pq(dim, {sub_dim, bits}, granularity_of(granularity));
            if (books.shape(0) != size_t(pq.n_books()))
              throw veloxquant::Error("from_codebooks: " + std::to_string(books.shape(0)) + " codebooks, expected " +
                                      std::to_string(pq.n_books()));
            return ProductQuantizer(dim, {sub_dim, bits}, granularity_of(granularity), books.data());
          },
          nb::arg("codebooks"), nb::arg("dim"), nb::arg("granularity") = "per_subspace",
          "A trained quantizer from codebooks: float32 [n_books, 2**bits, sub_dim].")
      .def(
          "train",
          [](ProductQuantizer& pq, In<float, 2> x, int max_iters, uint64_t seed, int max_points_per_centroid) {
            const size_t n = rows(pq, x.shape(1), x.shape(0), "train");
            nb::gil_scoped_release nogil;
            pq.train(x.data(), int64_t(n), {max_iters, seed, max_points_per_centroid});
          },
          nb::arg("x"), nb::arg("max_iters") = 25, nb::arg("seed") = 0, nb::arg("max_points_per_centroid") = 256,
          "k-means per codebook on x: float32 [n, dim] (n >= 2**bits). Deterministic for a seed.")
      .def(
          "encode",
          [](const ProductQuantizer& pq, In<float, 2> x) {
            const size_t n = rows(pq, x.shape(1), x.shape(0), "encode");
            auto out = new_array<uint8_t>({n, pq.code_size()});
            nb::gil_scoped_release nogil;
            pq.encode(x.data(), int64_t(n), out.data());
            return out;
          },
          nb::arg("x"), "x: float32 [n, dim] -> packed codes uint8 [n, code_size] (n_sub codes of `bits` bits each).")
      .def(
          "encode_codes",
          [](const ProductQuantizer& pq, In<float, 2> x) {
            const size_t n = rows(pq, x.shape(1), x.shape(0), "encode_codes");
            auto out = new_array<uint16_t>({n, size_t(pq.n_sub())});
            nb::gil_scoped_release nogil;
            pq.encode_codes(x.data(), int64_t(n), out.data());
            return out;
          },
          nb::arg("x"), "x: float32 [n, dim] -> centroid indices uint16 [n, n_sub].")
      .def(
          "decode",
          [](const ProductQuantizer& pq, In<uint8_t, 2> packed) {
            if (packed.shape(1) != pq.code_size())
              throw veloxquant::Error("decode: rows of " + std::to_string(packed.shape(1)) + " bytes, code_size is " +
                                      std::to_string(pq.code_size()));
            const size_t n = packed.shape(0);
            auto out = new_array<float>({n, size_t(pq.dim())});
            nb::gil_scoped_release nogil;
            pq.decode(packed.data(), int64_t(n), out.data());
            return out;
          },
          nb::arg("packed"), "packed: uint8 [n, code_size] -> float32 [n, dim].")
      .def(
          "decode_codes",
          [](const ProductQuantizer& pq, In<uint16_t, 2> codes) {
            if (codes.shape(1) != size_t(pq.n_sub()))
              throw veloxquant::Error("decode_codes: rows of " + std::to_string(codes.shape(1)) + " codes, n_sub is " +
                                      std::to_string(pq.n_sub()));
            const size_t n = codes.shape(0);
            auto out = new_array<float>({n, size_t(pq.dim())});
            nb::gil_scoped_release nogil;
            pq.decode_codes(codes.data(), int64_t(n), out.data());
            return out;
          },
          nb::arg("codes"), "codes: uint16 [n, n_sub] (each < 2**bits) -> float32 [n, dim].")
      .def_prop_ro("dim", &ProductQuantizer::dim)
      .def_prop_ro("n_sub", &ProductQuantizer::n_sub)
      .def_prop_ro("sub_dim", [](const ProductQuantizer& pq) { return pq.preset().sub_dim; })
      .def_prop_ro("bits", [](const ProductQuantizer& pq) { return pq.preset().bits; })
      .def_prop_ro("granularity", [](const ProductQuantizer& pq) { return granularity_name(pq.granularity()); })
      .def_prop_ro("code_size", &ProductQuantizer::code_size, "Bytes per packed vector: ceil(n_sub * bits / 8).")
      .def_prop_ro("n_books", &ProductQuantizer::n_books)
      .def_prop_ro("n_centroids", &ProductQuantizer::n_centroids)
      .def_prop_ro("trained", &ProductQuantizer::trained)
      .def_prop_ro(
          "codebooks",
          [](const ProductQuantizer& pq) {
            // A copy (small): a view would dangle once train() replaces the codebooks.
            const std::vector<float>& b = pq.codebooks();
            const size_t nb_ = b.empty() ? 0 : size_t(pq.n_books()), k = b.empty() ? 0 : size_t(pq.n_centroids());
            auto out = new_array<float>({nb_, k, size_t(pq.preset().sub_dim)});
            std::copy(b.begin(), b.end(), out.data());
            return out;
          },
          nb::rv_policy::move,  // a new array: not a reference into the quantizer
          "float32 [n_books, 2**bits, sub_dim] (a copy; empty before training).");
}

static std::string preset_name(veloxquant::PQPreset p) { return p.name(); }

static veloxquant::CalibrationOptions calib_options(int kmeans_iters, uint64_t seed, int max_points_per_centroid,
                                                    int segment_tokens, int skip_tokens) {
  return {kmeans_iters, seed, max_points_per_centroid, segment_tokens, skip_tokens};
}

static void bind_calibration(nb::module_& m) {
  nb::class_<Calibration>(m, "Calibration",
                          "VecInfer calibration: per layer and KV head, key smoothing factors and key/value "
                          "codebooks trained on a model's real keys and values. Immutable.")
      .def_static("load", &Calibration::load, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>(),
                  "Reads a .vqcal file (written by save() or `veloxquant calibrate`); checksum and sizes are checked.")
      .def("save", &Calibration::save, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>(),
           "Writes the file atomically (a temporary name, then renamed).")
      .def_static(
          "train",
          [](const std::vector<In<float, 3>>& keys, const std::vector<In<float, 3>>& values, const std::string& kv_cache,
             int kmeans_iters, uint64_t seed, int max_points_per_centroid, int segment_tokens, int skip_tokens,
             const std::string& model_name) {
            if (keys.empty() || keys.size() != values.size())
              throw veloxquant::Error("Calibration.train: " + std::to_string(keys.size()) + " key and " +
                                      std::to_string(values.size()) + " value arrays (need one of each per layer)");
            const size_t n = keys[0].shape(0), h = keys[0].shape(1), d = keys[0].shape(2);
            std::vector<const float*> k, v;
            for (size_t l = 0; l < keys.size(); ++l) {
              for (const auto* a : {&keys[l], &values[l]})
                if (a->shape(0) != n || a->shape(1) != h || a->shape(2) != d)
                  throw veloxquant::Error("Calibration.train: layer " + std::to_string(l) +
                                          ": every array must have the shape of keys[0], [" + std::to_string(n) + ", " +
                                          std::to_string(h) + ", " + std::to_string(d) + "]");
              k.push_back(keys[l].data());
              v.push_back(values[l].data());
            }
            const veloxquant::KVCacheConfig cfg = veloxquant::parse_kv_cache_config(kv_cache);
            nb::gil_scoped_release nogil;
            return Calibration::train(cfg, int(h), int(d), k, v, int64_t(n),
                                      calib_options(kmeans_iters, seed, max_points_per_centroid, segment_tokens,
                                                    skip_tokens),
                                      model_name);
          },
          nb::arg("keys"), nb::arg("values"), nb::arg("kv_cache") = "vecinfer:d4b8", nb::arg("kmeans_iters") = 12,
          nb::arg("seed") = 1234, nb::arg("max_points_per_centroid") = 64, nb::arg("segment_tokens") = 0,
          nb::arg("skip_tokens") = 4, nb::arg("model_name") = "",
          "Trains from recorded activations: keys[l], values[l] float32 [n_tokens, n_kv_heads, head_dim] (post-RoPE "
          "keys, values) of layer l. Presets and granularity come from the kv_cache spec string.")
      .def_static(
          "from_model",
          [](const veloxquant::Model& model, const std::string& text, int max_tokens, const std::string& kv_cache,
             int kmeans_iters, uint64_t seed, int max_points_per_centroid, int segment_tokens, int skip_tokens,
             int held_out_tokens, int key_mean_tokens, const std::string& key_transform) {
            const veloxquant::KVCacheConfig cfg = veloxquant::parse_kv_cache_config(kv_cache);
            veloxquant::CalibrationOptions o =
                calib_options(kmeans_iters, seed, max_points_per_centroid, segment_tokens, skip_tokens);
            o.held_out_tokens = held_out_tokens;
            o.key_mean_tokens = key_mean_tokens;
            o.key_transform = key_transform;
            nb::gil_scoped_release nogil;
            return Calibration::from_model(model, text, max_tokens, cfg, o);
          },
          nb::arg("model"), nb::arg("text"), nb::arg("max_tokens") = 2048, nb::arg("kv_cache") = "vecinfer:d4b8",
          nb::arg("kmeans_iters") = 12, nb::arg("seed") = 1234, nb::arg("max_points_per_centroid") = 64,
          nb::arg("segment_tokens") = 0, nb::arg("skip_tokens") = 4, nb::arg("held_out_tokens") = 1024,
          nb::arg("key_mean_tokens") = veloxquant::CalibrationOptions{}.key_mean_tokens,
          nb::arg("key_transform") = veloxquant::CalibrationOptions{}.key_transform,
          "Runs the model over the first max_tokens tokens of text, records every layer's keys and values and trains "
          "on them (segment_tokens 0: sequences of 2048 tokens); then compares the new cache with fp16 on up to "
          "held_out_tokens tokens of the text after those (held_out_check). key_mean_tokens > 0: the keys' rotated "
          "mean is removed before coding and its exact score added back (CPU and GPU); 0: none; -1: 16). key_transform: "
          "'learned' (a dense map per layer and KV head from the recorded keys and queries; CPU and GPU), "
          "'hadamard' (smoothing + Walsh-Hadamard) or 'auto' (learned for per-sub-space books from at least 16 "
          "tokens per key channel).")
      .def_prop_ro("key_transform", &Calibration::key_transform, "'hadamard' or 'learned'")
      .def_prop_ro("key_mean_tokens", &Calibration::key_mean_tokens,
                   "the rotated key mean's segment in tokens; 0: none")
      .def_prop_ro("n_layers", &Calibration::n_layers)
      .def_prop_ro("n_kv_heads", &Calibration::n_kv_heads)
      .def_prop_ro("head_dim", &Calibration::head_dim)
      .def_prop_ro("key_preset", [](const Calibration& c) { return preset_name(c.key_preset()); }, "e.g. 'd4b8'")
      .def_prop_ro("value_preset", [](const Calibration& c) { return preset_name(c.value_preset()); })
      .def_prop_ro("granularity", [](const Calibration& c) { return granularity_name(c.granularity()); })
      .def_prop_ro("n_calib_tokens", &Calibration::n_calib_tokens)
      .def_prop_ro("model_name", &Calibration::model_name)
      .def_prop_ro(
          "held_out_check",
          [](const Calibration& c) -> nb::object {
            const veloxquant::CalibrationCheck k = c.held_out_check();
            if (k.tokens == 0) return nb::none();
            nb::dict d;
            d["tokens"] = k.tokens, d["kl"] = k.kl, d["top1"] = k.top1, d["ppl_ratio"] = k.ppl_ratio;
            return d;
          },
          "None, or the cache against fp16 on held-out tokens when it was made: {tokens, kl, top1, ppl_ratio}.")
      .def(
          "smoothing",
          [](nb::handle self, int layer) {
            const auto& c = nb::cast<const Calibration&>(self);
            return view(c.smoothing(layer), {size_t(c.n_kv_heads()), size_t(c.head_dim())}, self);
          },
          nb::arg("layer"), "Read-only view float32 [n_kv_heads, head_dim]: the key smoothing factors of a layer.")
      .def(
          "key_codebooks",
          [](nb::handle self, int layer) {
            const auto& c = nb::cast<const Calibration&>(self);
            const auto p = c.key_preset();
            return view(c.key_codebooks(layer),
                        {size_t(c.n_kv_heads()), size_t(c.key_books()), size_t(1) << p.bits, size_t(p.sub_dim)}, self);
          },
          nb::arg("layer"), "Read-only view float32 [n_kv_heads, key_books, 2**bits, sub_dim].")
      .def(
          "value_codebooks",
          [](nb::handle self, int layer) {
            const auto& c = nb::cast<const Calibration&>(self);
            const auto p = c.value_preset();
            return view(c.value_codebooks(layer),
                        {size_t(c.n_kv_heads()), size_t(c.value_books()), size_t(1) << p.bits, size_t(p.sub_dim)},
                        self);
          },
          nb::arg("layer"), "Read-only view float32 [n_kv_heads, value_books, 2**bits, sub_dim].")
      .def("__repr__", [](const Calibration& c) {
        return "Calibration(" + std::to_string(c.n_layers()) + " layers, " + std::to_string(c.n_kv_heads()) +
               " kv heads, head_dim " + std::to_string(c.head_dim()) + ", k=" + preset_name(c.key_preset()) +
               ", v=" + preset_name(c.value_preset()) + ", " + granularity_name(c.granularity()) + ")";
      });
}

void bind_codec(nb::module_& m) {
  bind_pq(m);
  bind_calibration(m);
}

}  // namespace vqpy
