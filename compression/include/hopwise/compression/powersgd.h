// PowerSGD (Vogels et al., 2019): rank-r compression of a rows x cols float32 gradient matrix with two
// float32 allreduce-sums and an orthogonalization between them. It does not fit the one-payload Codec interface,
// so it has its own three calls per step (every rank makes them in the same order):
//
//   ps.compute_p(grad, rows, cols, p, state);   // p: rows x r'  -> allreduce-sum p over ranks (float32, kSum)
//   ps.compute_q(p, rows, cols, q, state);      // p: the summed P; q: r' x cols -> allreduce-sum q (float32, kSum)
//   ps.decompress(q, rows, cols, out, state);   // q: the summed Q; out (rows x cols) = the SUM over ranks,
//                                               //    approximated as P^ P^T (sum of M_r)
// r' = min(rank, rows, cols). With M_r = grad_r (+ residual_r when ef=1): P = sum_r M_r Q; P^ = P with
// orthonormal columns (modified Gram-Schmidt in double; a column that vanishes becomes 0); Q = sum_r M_r^T P^;
// out = P^ Q^T = P^ P^T sum_r M_r, the projection of the summed gradient onto span(P^). The summed Q is kept as
// the next step's warm start. Error feedback (ef=1, default): residual_r = M_r - P^ P^T M_r, so that over any
// number of steps sum(outputs) + sum_r(residual_r) == sum(inputs). Q starts as a standard normal matrix drawn
// from state.seed only (identical on every rank). A warm-up of uncompressed steps is the caller's choice (plain
// allreduce; do not call these for those steps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/compression/spec.h"

namespace hopwise::compression {

struct PowerSgdState {
  PowerSgdState() = default;
  explicit PowerSgdState(std::uint64_t seed) : seed(seed) {}
  std::uint64_t seed = 0;  // the same on every rank for the same tensor
  std::uint64_t step = 0;  // completed decompress() calls
  std::vector<float> q;         // warm start, r' x cols (empty until the first compute_p)
  std::vector<float> m;         // this step's M = grad (+ residual)
  std::vector<float> p_hat;     // orthonormalized P of this step, rows x r'
  std::vector<float> residual;  // error feedback, rows x cols
  std::size_t rows = 0, cols = 0;
  int phase = 0;  // 0: next call is compute_p, 1: compute_q, 2: decompress
};

class PowerSgd {
 public:
  PowerSgd(int rank, bool error_feedback);
  // Spec "powersgd[:rank=4,ef=1]"; rank in [1, 1024]. Errors as make_codec's.
  static PowerSgd from_spec(const CodecSpec& spec);
  static PowerSgd from_spec(std::string_view spec);

  std::string name() const;  // canonical spec, e.g. "powersgd:ef=1,rank=4"
  int rank() const { return rank_; }
  std::size_t effective_rank(std::size_t rows, std::size_t cols) const;
  std::size_t p_count(std::size_t rows, std::size_t cols) const { return rows * effective_rank(rows, cols); }
  std::size_t q_count(std::size_t rows, std::size_t cols) const { return cols * effective_rank(rows, cols); }

  void compute_p(const float* grad, std::size_t rows, std::size_t cols, float* p, PowerSgdState& state) const;
  void compute_q(const float* p_sum, std::size_t rows, std::size_t cols, float* q, PowerSgdState& state) const;
  void decompress(const float* q_sum, std::size_t rows, std::size_t cols, float* out, PowerSgdState& state) const;

 private:
  int rank_;
  bool ef_;
};

}  // namespace hopwise::compression
