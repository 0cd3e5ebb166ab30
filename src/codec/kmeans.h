#pragma once
// k-means codebook training: k-means++ (or random) initialisation, Lloyd iterations with a
// relative-tolerance stop, empty clusters re-seeded, subsampling to at most
// max_points_per_centroid points per centroid. A seed gives identical centroids for any thread
// count: assignments are per point, and every sum is accumulated in a fixed order in double.
#include <cstdint>
#include <vector>

namespace vq {

enum class KMeansInit { kmeanspp, random };

struct KMeansParams {
  int k = 256;                       // centroids, 1..65536
  int max_iters = 25;                // Lloyd iterations at most
  double tol = 1e-4;                 // stop when (prev - inertia) / prev < tol
  int max_points_per_centroid = 256; // subsample the data to k * this many points (0: all)
  int kpp_points_per_centroid = 32;  // k-means++ seeds from a subsample of k * this many points
  uint64_t seed = 0;
  KMeansInit init = KMeansInit::kmeanspp;
};

struct KMeansResult {
  std::vector<float> centroids;         // [k, d] f32 row-major
  std::vector<double> inertia_history;  // sum of squared distances after each assignment step
  double inertia = 0;                   // of the returned centroids on the (sub)sampled points
  int iterations = 0;                   // Lloyd iterations run
  int empty_reseeds = 0;                // empty clusters re-seeded in total
  int64_t n_used = 0;                   // points after subsampling
};

// x: [n, d] f32 row-major. Throws vq::Error on n < k, d < 1, k out of range or non-finite data.
// Empty cluster: its centroid moves onto the point farthest from its own centroid (then the
// next farthest for further empties), which never raises the inertia. If every point already
// sits on a centroid (fewer distinct points than k), empty clusters keep duplicate centroids.
KMeansResult kmeans(const float* x, int64_t n, int d, const KMeansParams& p);

// Sum over points of the squared distance to the nearest centroid (double; threads, fixed order).
// x: [n, d]; centroids: [k, d].
double kmeans_inertia(const float* x, int64_t n, int d, const float* centroids, int k);

}  // namespace vq
