// PowerSGD: P = M Q, orthonormalize P, Q = M^T P^, out = P^ Q^T (see powersgd.h).
#include "hopwise/compression/powersgd.h"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "hopwise/common/error.h"

namespace hopwise::compression {

namespace {

std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double unit(std::uint64_t& s) { return static_cast<double>(splitmix64(s) >> 11) * 0x1p-53; }

}  // namespace

PowerSgd::PowerSgd(int rank, bool error_feedback) : rank_(rank), ef_(error_feedback) {
  if (rank < 1 || rank > 1024)
    throw InvalidArgument(fmt::format("powersgd: rank={} is not an integer in [1, 1024]", rank));
}

PowerSgd PowerSgd::from_spec(std::string_view spec) { return from_spec(parse_codec_spec(spec)); }

PowerSgd PowerSgd::from_spec(const CodecSpec& spec) {
  if (spec.name != "powersgd")
    throw InvalidArgument(fmt::format("codec spec '{}': PowerSgd::from_spec takes 'powersgd', not '{}'",
                                      spec.to_string(), spec.name));
  int rank = 4;
  bool ef = true;
  for (const auto& [k, v] : spec.params) {
    if (k == "rank") {
      errno = 0;
      char* end = nullptr;
      const long long r = std::strtoll(v.c_str(), &end, 10);
      if (errno != 0 || end == v.c_str() || *end != '\0' || r < 1 || r > 1024)
        throw InvalidArgument(
            fmt::format("codec spec '{}': rank={} is not an integer in [1, 1024]", spec.to_string(), v));
      rank = static_cast<int>(r);
    } else if (k == "ef") {
      if (v != "0" && v != "1")
        throw InvalidArgument(fmt::format("codec spec '{}': ef={} is not one of 0|1", spec.to_string(), v));
      ef = v == "1";
    } else {
      throw InvalidArgument(fmt::format("codec spec '{}': codec 'powersgd' has no parameter '{}'; it takes: rank, ef",
                                        spec.to_string(), k));
    }
  }
  return PowerSgd(rank, ef);
}

std::string PowerSgd::name() const { return fmt::format("powersgd:ef={},rank={}", ef_ ? 1 : 0, rank_); }

std::size_t PowerSgd::effective_rank(std::size_t rows, std::size_t cols) const {
  return std::min({static_cast<std::size_t>(rank_), rows, cols});
}

void PowerSgd::compute_p(const float* grad, std::size_t rows, std::size_t cols, float* p,
                         PowerSgdState& state) const {
  const std::size_t n = rows * cols, r = effective_rank(rows, cols);
  if (state.phase != 0)
    throw InvalidArgument("powersgd: compute_p called before the previous step's decompress; call compute_p, "
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
    if (ef_) state.residual.assign(n, 0.0f);
  } else if (state.rows != rows || state.cols != cols) {
    throw InvalidArgument(fmt::format("powersgd: the state belongs to a {} x {} matrix, not {} x {}; keep one "
                                      "PowerSgdState per tensor",
                                      state.rows, state.cols, rows, cols));
  }
  state.m.resize(n);
  float* m = state.m.data();
  if (ef_)
    for (std::size_t i = 0; i < n; ++i) m[i] = grad[i] + state.residual[i];
  else
    std::copy(grad, grad + n, m);
  const float* q = state.q.data();
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < r; ++j) {
      const float* a = m + i * cols;
      const float* b = q + j * cols;
      double acc[4] = {0, 0, 0, 0};
      std::size_t c = 0;
      for (; c + 4 <= cols; c += 4)
        for (int l = 0; l < 4; ++l) acc[l] += static_cast<double>(a[c + l]) * b[c + l];
      for (; c < cols; ++c) acc[0] += static_cast<double>(a[c]) * b[c];
      p[i * r + j] = static_cast<float>(acc[0] + acc[1] + acc[2] + acc[3]);
    }
  state.phase = 1;
}

void PowerSgd::compute_q(const float* p_sum, std::size_t rows, std::size_t cols, float* q,
                         PowerSgdState& state) const {
  const std::size_t r = effective_rank(rows, cols);
  if (state.phase != 1 || state.rows != rows || state.cols != cols)
    throw InvalidArgument("powersgd: compute_q must follow compute_p on the same state and shape");
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
  // q (r x cols) = P^T M, accumulated row by row of M (contiguous inner loop over columns).
  const float* m = state.m.data();
  const float* ph = state.p_hat.data();
  std::fill(q, q + r * cols, 0.0f);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < r; ++j) {
      const float a = ph[i * r + j];
      float* qj = q + j * cols;
      const float* mi = m + i * cols;
      for (std::size_t c = 0; c < cols; ++c) qj[c] += a * mi[c];
    }
  if (ef_) {  // residual = M - P^ q_local
    float* res = state.residual.data();
    for (std::size_t i = 0; i < rows; ++i) {
      float* ri = res + i * cols;
      const float* mi = m + i * cols;
      std::copy(mi, mi + cols, ri);
      for (std::size_t j = 0; j < r; ++j) {
        const float a = ph[i * r + j];
        const float* qj = q + j * cols;
        for (std::size_t c = 0; c < cols; ++c) ri[c] -= a * qj[c];
      }
    }
  }
  state.phase = 2;
}

void PowerSgd::decompress(const float* q_sum, std::size_t rows, std::size_t cols, float* out,
                          PowerSgdState& state) const {
  const std::size_t r = effective_rank(rows, cols);
  if (state.phase != 2 || state.rows != rows || state.cols != cols)
    throw InvalidArgument("powersgd: decompress must follow compute_q on the same state and shape");
  const float* ph = state.p_hat.data();
  for (std::size_t i = 0; i < rows; ++i) {
    float* oi = out + i * cols;
    std::fill(oi, oi + cols, 0.0f);
    for (std::size_t j = 0; j < r; ++j) {
      const float a = ph[i * r + j];
      const float* qj = q_sum + j * cols;
      for (std::size_t c = 0; c < cols; ++c) oi[c] += a * qj[c];
    }
  }
  state.q.assign(q_sum, q_sum + r * cols);
  ++state.step;
  state.phase = 0;
}

}  // namespace hopwise::compression
