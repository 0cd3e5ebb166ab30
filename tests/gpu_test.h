#pragma once
// GPU tests outside tests/ops: skip with a clear message where no CUDA device can be used (CI).
#include <gtest/gtest.h>

#include <string>

#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace vq::test {

inline bool gpu_usable(std::string* why) {
#ifdef VQ_HAVE_CUDA
  if (cuda::cuda_device_available()) return true;
  *why = cuda::cuda_unavailable_reason();
#else
  *why = "this build has no CUDA backend";
#endif
  return false;
}

}  // namespace vq::test

#define VQ_SKIP_WITHOUT_GPU()                                                                          \
  do {                                                                                                 \
    std::string vq_why_;                                                                               \
    if (!::vq::test::gpu_usable(&vq_why_))                                                             \
      GTEST_SKIP() << "no usable CUDA device (" << vq_why_ << "): GPU tests run on the H200";          \
  } while (0)
