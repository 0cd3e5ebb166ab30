#include "codec/learned_key_map.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace vq {
namespace {

using Mat = Eigen::MatrixXd;
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Eigenvalues below rel * the largest are raised to it: a direction with (almost) no key variance or
// no query energy must not send the map to 0 or infinity.
constexpr double kRelFloor = 1e-6;

Mat symmetric(const std::vector<double>& a, int D, const char* what) {
  VQ_CHECK(a.size() == size_t(D) * size_t(D), "learned key map: {} has {} values for [{}, {}]", what, a.size(), D, D);
  Mat m(D, D);
  double scale = 0;
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) {
      const double x = a[size_t(i) * D + j];
      VQ_CHECK(std::isfinite(x), "learned key map: {}[{}, {}] is {}", what, i, j, x);
      m(i, j) = x;
      scale = std::max(scale, std::fabs(x));
    }
  VQ_CHECK(scale > 0, "learned key map: {} is all zero (no calibration tokens?)", what);
  VQ_CHECK((m - m.transpose()).cwiseAbs().maxCoeff() <= 1e-9 * scale, "learned key map: {} is not symmetric", what);
  return 0.5 * (m + m.transpose());
}

// f(S) for a symmetric positive semi-definite S: V f(max(w, floor)) V'.
template <class F>
Mat spectral(const Mat& s, F f) {
  Eigen::SelfAdjointEigenSolver<Mat> es(s);
  VQ_CHECK(es.info() == Eigen::Success, "learned key map: the eigendecomposition did not converge");
  Eigen::VectorXd w = es.eigenvalues();
  const double floor = std::max(w.maxCoeff(), 0.0) * kRelFloor;
  VQ_CHECK(floor > 0, "learned key map: a second-moment matrix has no positive eigenvalue");
  for (int i = 0; i < w.size(); ++i) w(i) = f(std::max(w(i), floor));
  const Mat& v = es.eigenvectors();
  Mat r = v * w.asDiagonal() * v.transpose();
  return 0.5 * (r + r.transpose());
}

// The eigen-directions (indices into w) in coded-channel order: sub-spaces of sub_dim consecutive
// channels, each filled greedily (largest variance first, into the sub-space with room whose log
// product is smallest), so the sub-spaces' products of variances come out about equal.
std::vector<int> balanced_order(const Eigen::VectorXd& w, int sub_dim) {
  const int D = int(w.size()), G = D / sub_dim;
  const double floor = std::max(w.maxCoeff(), 1e-300) * kRelFloor;
  std::vector<int> by_size(static_cast<size_t>(D));
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(), [&](int a, int b) { return w(a) > w(b); });
  std::vector<std::vector<int>> groups(static_cast<size_t>(G));
  std::vector<double> log_sum(static_cast<size_t>(G), 0.0);
  for (int i : by_size) {
    int best = -1;
    for (int g = 0; g < G; ++g)
      if (int(groups[size_t(g)].size()) < sub_dim && (best < 0 || log_sum[size_t(g)] < log_sum[size_t(best)])) best = g;
    groups[size_t(best)].push_back(i);
    log_sum[size_t(best)] += std::log(std::max(w(i), floor));
  }
  std::vector<int> order;
  for (const auto& g : groups) order.insert(order.end(), g.begin(), g.end());
  return order;
}

}  // namespace

std::vector<float> learned_key_map(const std::vector<double>& key_cov, const std::vector<double>& query_moment, int D,
                                   int sub_dim) {
  VQ_CHECK(D >= 1 && sub_dim >= 1 && D % sub_dim == 0, "learned key map: sub_dim {} does not divide head_dim {}",
           sub_dim, D);
  const Mat sk = symmetric(key_cov, D, "key covariance");
  const Mat sq = symmetric(query_moment, D, "query second moment");
  // B = Sk^-1 # Sq = Sk^-1/2 (Sk^1/2 Sq Sk^1/2)^1/2 Sk^-1/2, A = B^1/2.
  const Mat sk_h = spectral(sk, [](double x) { return std::sqrt(x); });
  const Mat sk_ih = spectral(sk, [](double x) { return 1.0 / std::sqrt(x); });
  const Mat sq_f = spectral(sq, [](double x) { return x; });  // Sq with its floor
  const Mat mid = spectral(Mat(sk_h * sq_f * sk_h), [](double x) { return std::sqrt(x); });
  const Mat b = sk_ih * mid * sk_ih;
  const Mat a = spectral(Mat(0.5 * (b + b.transpose())), [](double x) { return std::sqrt(x); });
  // The coded keys' covariance A Sk A, its eigen-directions dealt into the sub-spaces.
  const Mat c = a * sk * a;
  Eigen::SelfAdjointEigenSolver<Mat> es(Mat(0.5 * (c + c.transpose())));
  VQ_CHECK(es.info() == Eigen::Success, "learned key map: the eigendecomposition did not converge");
  const std::vector<int> order = balanced_order(es.eigenvalues(), sub_dim);
  Mat p(D, D);
  for (int r = 0; r < D; ++r) p.row(r) = es.eigenvectors().col(order[size_t(r)]).transpose();
  Mat m = p * a;
  const double coded = (m * sk * m.transpose()).trace(), orig = sk.trace();
  VQ_CHECK(coded > 0 && orig > 0, "learned key map: the keys have no variance");
  m *= std::sqrt(orig / coded);
  std::vector<float> out(size_t(D) * D);
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) {
      const double x = m(i, j);
      VQ_CHECK(std::isfinite(x) && std::fabs(x) <= 65504.0, "learned key map: entry [{}, {}] = {} is out of range", i,
               j, x);
      out[size_t(i) * D + j] = float(x);
    }
  return out;
}

std::vector<float> key_map_query_side(const float* M, int D, const char* what) {
  Mat m(D, D);
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) {
      const double x = M[size_t(i) * D + j];
      VQ_CHECK(std::isfinite(x), "{}: key map entry [{}, {}] is {}", what, i, j, x);
      m(i, j) = x;
    }
  Eigen::FullPivLU<Mat> lu(m);
  VQ_CHECK(lu.isInvertible(), "{}: the key map is singular (rank {} of {})", what, lu.rank(), D);
  const Mat n = lu.inverse().transpose();
  std::vector<float> out(size_t(D) * D);
  Mat nf(D, D);
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) {
      const double x = n(i, j);
      VQ_CHECK(std::isfinite(x) && std::fabs(x) <= 65504.0, "{}: the key map's inverse has entry [{}, {}] = {}", what, i,
               j, x);
      out[size_t(i) * D + j] = float(x);
      nf(i, j) = double(out[size_t(i) * D + j]);
    }
  // q~ . k~ = q' N' M k: N' M must be the identity to the precision the scores are computed in.
  const double err = (nf.transpose() * m - Mat::Identity(D, D)).cwiseAbs().maxCoeff();
  VQ_CHECK(err <= 1e-3, "{}: the key map is too ill-conditioned (N'M differs from the identity by {:.3g})", what, err);
  return out;
}

std::vector<double> covariance_of_rows(const float* x, int64_t n, int D) {
  VQ_CHECK(n >= 2 && D >= 1, "learned key map: a covariance of {} rows of {}", n, D);
  Eigen::MatrixXd m = Eigen::Map<const RowMatF>(x, Eigen::Index(n), D).cast<double>();
  const Eigen::RowVectorXd mean = m.colwise().mean();
  m.rowwise() -= mean;
  const Mat c = (m.transpose() * m) / double(n);
  std::vector<double> out(size_t(D) * D);
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) out[size_t(i) * D + j] = 0.5 * (c(i, j) + c(j, i));
  return out;
}

void add_second_moment(const float* x, int64_t n, int D, int64_t stride, double* S) {
  if (n <= 0) return;
  Eigen::Map<const RowMatF, 0, Eigen::OuterStride<>> rows(x, Eigen::Index(n), D, Eigen::OuterStride<>(stride));
  const Eigen::MatrixXd g = (rows.transpose() * rows).cast<double>();
  Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> s(S, D, D);
  s += g;
}

std::vector<float> key_maps_query_side(const float* maps, int n_heads, int D, const char* what) {
  std::vector<float> out(size_t(n_heads) * D * D);
  for (int h = 0; h < n_heads; ++h) {
    const std::vector<float> n = key_map_query_side(maps + size_t(h) * D * D, D, what);
    std::copy(n.begin(), n.end(), out.begin() + ptrdiff_t(size_t(h) * D * D));
  }
  return out;
}

}  // namespace vq
