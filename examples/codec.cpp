// The product quantizer on plain arrays: train on random vectors, encode, decode, and print the
// bytes per vector and the relative reconstruction error. Needs no model.
#include <veloxquant/codec.h>
#include <veloxquant/runtime.h>

#include <cstdio>
#include <random>
#include <vector>

int main() {
  namespace vx = veloxquant;
  try {
    const int dim = 64, n = 4096;
    std::vector<float> x(size_t(n) * dim);  // [n, dim] float32, row-major
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (float& v : x) v = normal(rng);

    vx::ProductQuantizer pq(dim, {4, 8});  // 4-element sub-vectors, 256 centroids: 2 bits/element
    pq.train(x.data(), n);
    std::vector<uint8_t> codes(size_t(n) * pq.code_size());  // [n, code_size] bytes
    pq.encode(x.data(), n, codes.data());
    std::vector<float> y(x.size());  // [n, dim] float32
    pq.decode(codes.data(), n, y.data());

    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += double(x[i] - y[i]) * double(x[i] - y[i]);
      ref += double(x[i]) * double(x[i]);
    }
    std::printf("veloxquant %s: %d floats -> %zu bytes per vector, relative squared error %.4f\n",
                vx::version().c_str(), dim, pq.code_size(), err / ref);
    return err / ref < 0.5 ? 0 : 1;  // far below 1 (the error of decoding to zero) or something is wrong
  } catch (const vx::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
