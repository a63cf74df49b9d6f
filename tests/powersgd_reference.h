// The serial PowerSGD reference of the tests: one step of p ranks with the allreduce-sums done here, adding the
// ranks' P and Q in rank order (what every communicator path is compared with), and the relative L2 difference
// the comparisons use.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "hopwise/compression/powersgd.h"

namespace hwtest {

// One compressed step of a rows x cols matrix over grads.size() ranks, st[r] being rank r's state. Returns the
// summed output; every rank's decompress must give the same (checked).
inline std::vector<float> powersgd_step(const hopwise::compression::PowerSgd& ps,
                                        const std::vector<std::vector<float>>& grads, std::size_t rows,
                                        std::size_t cols, std::vector<hopwise::compression::PowerSgdState>& st) {
  const std::size_t p = grads.size();
  std::vector<float> psum(ps.p_count(rows, cols), 0.0f), qsum(ps.q_count(rows, cols), 0.0f);
  for (std::size_t r = 0; r < p; ++r) {
    std::vector<float> pr(psum.size());
    ps.compute_p(grads[r].data(), rows, cols, pr.data(), st[r]);
    for (std::size_t i = 0; i < pr.size(); ++i) psum[i] += pr[i];
  }
  for (std::size_t r = 0; r < p; ++r) {
    std::vector<float> qr(qsum.size());
    ps.compute_q(psum.data(), rows, cols, qr.data(), st[r]);
    for (std::size_t i = 0; i < qr.size(); ++i) qsum[i] += qr[i];
  }
  std::vector<float> out(rows * cols), other(rows * cols);
  for (std::size_t r = 0; r < p; ++r) {
    ps.decompress(qsum.data(), rows, cols, r == 0 ? out.data() : other.data(), st[r]);
    if (r > 0) {
      EXPECT_EQ(other, out) << "ranks decompressed different results";
    }
  }
  return out;
}

// ||a - b|| / ||b|| (the absolute difference where b is 0).
inline double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace hwtest
