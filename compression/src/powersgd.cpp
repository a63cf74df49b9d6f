// PowerSGD: P = M Q, orthonormalize P, Q = M^T P^, out = P^ Q^T (see powersgd.h).
#include "hopwise/compression/powersgd.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "hopwise/common/error.h"
#include "spec_params.h"

namespace hopwise::compression {

namespace {

std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double unit(std::uint64_t& s) { return static_cast<double>(splitmix64(s) >> 11) * 0x1p-53; }

// The three calls of a step come in turn, on one tensor's state.
void expect_phase(const PowerSgdState& state, int phase, std::size_t rows, std::size_t cols, const char* what) {
  if (state.phase != phase || state.rows != rows || state.cols != cols)
    throw InvalidArgument(fmt::format("powersgd: {} on the same state and shape", what));
}

// The products below are memory-bound passes over rows x cols floats: each reads a row once for all r factors,
// in float lanes the compiler vectorizes (AVX2 clone picked at run time); partial sums per row go to double.
#define HOPWISE_PSGD_CLONES __attribute__((target_clones("avx2", "default")))
constexpr std::size_t kLanes = 16;

// The row's M: g_i alone, or with error feedback g_i + residual_i where the residual of the previous step,
// m_i - sum_j ph_i[j] * q_local_j, is formed here on the fly (in place over m_i: no residual array to write and
// read back). Then p_i[j] = <m_i, q_j> for j < r. acc: r * kLanes floats of scratch.
HOPWISE_PSGD_CLONES void row_times_q(const float* g, float* mi, const float* ph_prev, const float* q_local,
                                     std::size_t r_prev, bool feedback, std::size_t cols, const float* q, std::size_t r,
                                     float* pi, float* acc) {
  const float* src = g;
  if (feedback) {
    for (std::size_t j = 0; j < r_prev; ++j) {  // m_i -= ph_i[j] * q_local_j: the residual
      const float w = ph_prev[j];
      const float* qj = q_local + j * cols;
      for (std::size_t c = 0; c < cols; ++c) mi[c] -= w * qj[c];
    }
    for (std::size_t c = 0; c < cols; ++c) mi[c] += g[c];
    src = mi;
  }
  for (std::size_t j = 0; j < r; ++j) {
    const float* qj = q + j * cols;
    float* a = acc + j * kLanes;
    for (std::size_t l = 0; l < kLanes; ++l) a[l] = 0.0f;
    std::size_t c = 0;
    for (; c + kLanes <= cols; c += kLanes)
      for (std::size_t l = 0; l < kLanes; ++l) a[l] += src[c + l] * qj[c + l];
    double sum = 0;
    for (; c < cols; ++c) sum += static_cast<double>(src[c]) * qj[c];
    for (std::size_t l = 0; l < kLanes; ++l) sum += a[l];
    pi[j] = static_cast<float>(sum);
  }
}

// out_i (+)= sum_j a[j] * q_j  (out_i = base_i - ... when `subtract`, from base_i).
HOPWISE_PSGD_CLONES void combine_row(const float* a, std::size_t r, const float* q, std::size_t cols, float* out,
                                     const float* base, bool subtract) {
  if (base)
    for (std::size_t c = 0; c < cols; ++c) out[c] = base[c];
  else
    for (std::size_t c = 0; c < cols; ++c) out[c] = 0.0f;
  for (std::size_t j = 0; j < r; ++j) {
    const float w = subtract ? -a[j] : a[j];
    const float* qj = q + j * cols;
    for (std::size_t c = 0; c < cols; ++c) out[c] += w * qj[c];
  }
}

// q_j += a[j] * m_i for j < r (accumulating P^T M one row of M at a time).
HOPWISE_PSGD_CLONES void accumulate_row(const float* a, std::size_t r, const float* mi, std::size_t cols, float* q) {
  for (std::size_t j = 0; j < r; ++j) {
    const float w = a[j];
    float* qj = q + j * cols;
    for (std::size_t c = 0; c < cols; ++c) qj[c] += w * mi[c];
  }
}

}  // namespace

PowerSgd::PowerSgd(int rank, bool error_feedback, std::uint64_t warmup)
    : rank_(rank), ef_(error_feedback), warmup_(warmup) {
  if (rank < 1 || rank > 1024)
    throw InvalidArgument(fmt::format("powersgd: rank={} is not an integer in [1, 1024]", rank));
}

PowerSgd PowerSgd::from_spec(std::string_view spec) { return from_spec(parse_codec_spec(spec)); }

PowerSgd PowerSgd::from_spec(const CodecSpec& spec) {
  if (spec.name != "powersgd")
    throw InvalidArgument(
        fmt::format("codec spec '{}': PowerSgd::from_spec takes 'powersgd', not '{}'", spec.to_string(), spec.name));
  detail::Params p(spec, {{"rank", "4"}, {"ef", "1"}, {"warmup", "0"}});
  const auto rank = static_cast<int>(p.get_int("rank", 1, 1024));
  const bool ef = p.get_flag("ef");
  const auto warmup = static_cast<std::uint64_t>(p.get_int("warmup", 0, 1000000000));
  return PowerSgd(rank, ef, warmup);
}

std::string PowerSgd::name() const {
  return fmt::format("powersgd:ef={},rank={}{}", ef_ ? 1 : 0, rank_,
                     warmup_ > 0 ? fmt::format(",warmup={}", warmup_) : std::string());
}

bool PowerSgd::compresses(std::size_t rows, std::size_t cols) const {
  if (rows < 2 || cols < 2) return false;
  return 2 * (rows + cols) * effective_rank(rows, cols) <= rows * cols;
}

std::size_t PowerSgd::effective_rank(std::size_t rows, std::size_t cols) const {
  return std::min({static_cast<std::size_t>(rank_), rows, cols});
}

void PowerSgd::compute_p(const float* grad, std::size_t rows, std::size_t cols, float* p, PowerSgdState& state) const {
  const std::size_t n = rows * cols, r = effective_rank(rows, cols);
  if (state.phase != 0)
    throw InvalidArgument(
        "powersgd: compute_p called before the previous step's decompress; call compute_p, "
        "compute_q, decompress in turn");
  if ((n > 0 && (grad == nullptr || p == nullptr)))
    throw InvalidArgument(fmt::format("powersgd: null buffer for a {} x {} matrix", rows, cols));
  if (state.q.empty() && state.rows == 0 && state.cols == 0) {
    state.rows = rows;
    state.cols = cols;
    state.q.resize(r * cols);
    std::uint64_t s = state.seed ^ 0x50535344ull;
    for (auto& v : state.q) {  // standard normal (Box-Muller)
      const double u1 = 1.0 - unit(s), u2 = unit(s);
      v = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
    if (ef_) state.m.assign(n, 0.0f);  // no residual yet: M = grad
  } else if (state.rows != rows || state.cols != cols) {
    throw InvalidArgument(
        fmt::format("powersgd: the state belongs to a {} x {} matrix, not {} x {}; keep one "
                    "PowerSgdState per tensor",
                    state.rows, state.cols, rows, cols));
  }
  // Without error feedback M is the gradient itself: read in place (it must stay unchanged until compute_q).
  state.grad = grad;
  const float* q = state.q.data();
  const bool feedback = ef_ && !state.q_local.empty();
  const std::size_t r_prev = feedback ? state.q_local.size() / cols : 0;
  std::vector<float> acc(r * kLanes);
  for (std::size_t i = 0; i < rows; ++i)
    row_times_q(grad + i * cols, ef_ ? state.m.data() + i * cols : nullptr,
                feedback ? state.p_hat.data() + i * r_prev : nullptr, feedback ? state.q_local.data() : nullptr, r_prev,
                ef_, cols, q, r, p + i * r, acc.data());
  state.phase = 1;
}

void PowerSgd::compute_q(const float* p_sum, std::size_t rows, std::size_t cols, float* q, PowerSgdState& state) const {
  const std::size_t r = effective_rank(rows, cols);
  expect_phase(state, 1, rows, cols, "compute_q must follow compute_p");
  // Modified Gram-Schmidt on the columns of P (rows x r, row-major), in double.
  std::vector<double> col(rows);
  state.p_hat.assign(rows * r, 0.0f);
  std::vector<double> basis(rows * r, 0.0);  // column-major copy of P^ in double
  for (std::size_t j = 0; j < r; ++j) {
    for (std::size_t i = 0; i < rows; ++i) col[i] = p_sum[i * r + j];
    for (std::size_t k = 0; k < j; ++k) {
      const double* e = basis.data() + k * rows;
      double d = 0;
      for (std::size_t i = 0; i < rows; ++i) d += col[i] * e[i];
      for (std::size_t i = 0; i < rows; ++i) col[i] -= d * e[i];
    }
    double norm = 0;
    for (std::size_t i = 0; i < rows; ++i) norm += col[i] * col[i];
    norm = std::sqrt(norm);
    if (!(norm > 1e-30) || !std::isfinite(norm)) continue;  // a vanished (or broken) column stays 0
    double* e = basis.data() + j * rows;
    for (std::size_t i = 0; i < rows; ++i) {
      e[i] = col[i] / norm;
      state.p_hat[i * r + j] = static_cast<float>(e[i]);
    }
  }
  // q (r x cols) = P^T M, accumulated row by row of M (contiguous inner loop over columns); this rank's own q is
  // kept: with error feedback the residual M - P^ q_local is formed from it in the next compute_p.
  const float* m = ef_ ? state.m.data() : state.grad;
  const float* ph = state.p_hat.data();
  std::fill(q, q + r * cols, 0.0f);
  for (std::size_t i = 0; i < rows; ++i) accumulate_row(ph + i * r, r, m + i * cols, cols, q);
  if (ef_) state.q_local.assign(q, q + r * cols);
  state.grad = nullptr;
  state.phase = 2;
}

void PowerSgd::decompress(const float* q_sum, std::size_t rows, std::size_t cols, float* out,
                          PowerSgdState& state) const {
  const std::size_t r = effective_rank(rows, cols);
  expect_phase(state, 2, rows, cols, "decompress must follow compute_q");
  const float* ph = state.p_hat.data();
  for (std::size_t i = 0; i < rows; ++i) combine_row(ph + i * r, r, q_sum, cols, out + i * cols, nullptr, false);
  state.q.assign(q_sum, q_sum + r * cols);
  ++state.step;
  state.phase = 0;
}

std::vector<float> PowerSgd::residual(const PowerSgdState& state) const {
  if (!ef_ || state.q_local.empty()) return {};
  const std::size_t rows = state.rows, cols = state.cols, r = state.q_local.size() / cols;
  std::vector<float> res(rows * cols);
  for (std::size_t i = 0; i < rows; ++i)
    combine_row(state.p_hat.data() + i * r, r, state.q_local.data(), cols, res.data() + i * cols,
                state.m.data() + i * cols, true);
  return res;
}

}  // namespace hopwise::compression
