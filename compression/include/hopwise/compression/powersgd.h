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
// number of steps sum(outputs) + sum_r(residual_r) == sum(inputs). With ef=0 the gradient is read in place
// by compute_p and again by compute_q: it must not change in between. Q starts as a standard normal matrix drawn
// from state.seed only (identical on every rank). The first `warmup` steps of a tensor, and matrices that
// compresses() rejects, go uncompressed: the caller all-reduces them plainly and calls skip() for warm-up steps
// (comm/'s allreduce_powersgd does all of this).
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
  std::uint64_t seed = 0;       // the same on every rank for the same tensor
  std::uint64_t step = 0;       // completed steps: decompress() calls and skip()ped warm-up steps
  std::vector<float> q;         // warm start, r' x cols (empty until the first compute_p)
  std::vector<float> m;         // ef=1: this step's M = grad + residual (the residual stays implicit, see residual())
  std::vector<float> p_hat;     // orthonormalized P of this step, rows x r'
  std::vector<float> q_local;   // ef=1: this rank's P^T M of the last step (before the sum)
  const float* grad = nullptr;  // ef=0: M is the gradient itself, read again by compute_q
  std::size_t rows = 0, cols = 0;
  int phase = 0;  // 0: next call is compute_p, 1: compute_q, 2: decompress
};

class PowerSgd {
 public:
  PowerSgd(int rank, bool error_feedback, std::uint64_t warmup = 0);
  // Spec "powersgd[:rank=4,ef=1,warmup=0]"; rank in [1, 1024], warmup in [0, 1e9] steps. Errors as make_codec's.
  static PowerSgd from_spec(const CodecSpec& spec);
  static PowerSgd from_spec(std::string_view spec);

  std::string name() const;  // canonical spec, e.g. "powersgd:ef=1,rank=4" (",warmup=N" when N > 0)
  int rank() const { return rank_; }
  std::uint64_t warmup() const { return warmup_; }
  bool error_feedback() const { return ef_; }
  // Whether a rows x cols matrix is worth compressing: 2-D, and (rows + cols) * r' at most half of rows * cols
  // (below that the two allreduces and the orthogonalization cost more than they save).
  bool compresses(std::size_t rows, std::size_t cols) const;
  // Whether this step of the tensor goes compressed: compresses() and past the warm-up.
  bool compressed_step(std::size_t rows, std::size_t cols, const PowerSgdState& state) const {
    return compresses(rows, cols) && state.step >= warmup_;
  }
  // Bytes this rank puts on the wire for the tensor's next step: its P and Q factors when compressed_step, else
  // the floats themselves.
  std::size_t step_bytes(std::size_t rows, std::size_t cols, const PowerSgdState& state) const {
    return (compressed_step(rows, cols, state) ? p_count(rows, cols) + q_count(rows, cols) : rows * cols) *
           sizeof(float);
  }
  // Counts an uncompressed (warm-up or rejected) step in state.step.
  void skip(PowerSgdState& state) const { ++state.step; }
  // What error feedback still owes the tensor after the last decompress: M - P^ q_local (empty with ef=0 or
  // before the first step). Not stored: compute_p forms it on the fly, row by row, as it builds the next M.
  std::vector<float> residual(const PowerSgdState& state) const;
  std::size_t effective_rank(std::size_t rows, std::size_t cols) const;
  std::size_t p_count(std::size_t rows, std::size_t cols) const { return rows * effective_rank(rows, cols); }
  std::size_t q_count(std::size_t rows, std::size_t cols) const { return cols * effective_rank(rows, cols); }

  void compute_p(const float* grad, std::size_t rows, std::size_t cols, float* p, PowerSgdState& state) const;
  void compute_q(const float* p_sum, std::size_t rows, std::size_t cols, float* q, PowerSgdState& state) const;
  void decompress(const float* q_sum, std::size_t rows, std::size_t cols, float* out, PowerSgdState& state) const;

 private:
  int rank_;
  bool ef_;
  std::uint64_t warmup_;
};

}  // namespace hopwise::compression
