// Bench's compressed rows (-C SPEC): a compressed allreduce of random normal floats per codec, or PowerSGD over
// the buffer seen as a matrix, timed, measured against the exact sum and checked against the codec's own stated
// result. Apart from the algorithm rows (bench.cpp): these use other data, timing and checks.
#include "bench.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"

namespace hopwise::bench {

void Bench::normal_fill(float* v, std::size_t count, int rank) {
  std::mt19937 g(static_cast<std::uint32_t>(1234 + rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::size_t i = 0; i < count; ++i) v[i] = d(g);
}

double Bench::relative_l2(const float* out, const float* exact, std::size_t count) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < count; ++i) {
    num += (static_cast<double>(out[i]) - exact[i]) * (static_cast<double>(out[i]) - exact[i]);
    den += static_cast<double>(exact[i]) * exact[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

Bench::CodecBuffers Bench::codec_buffers(std::size_t count) {
  CodecBuffers b{reinterpret_cast<float*>(in_->data), reinterpret_cast<float*>(out_->data),
                 reinterpret_cast<float*>(expected_->data)};
  normal_fill(b.in, count, rank_);
  comm_.allreduce(b.in, b.exact, count, DataType::kFloat32, ReduceOp::kSum);
  return b;
}

Row Bench::codec_timing(std::size_t count, const std::vector<double>& sorted_times, double mpi_t) const {
  const double median = sorted_times[sorted_times.size() / 2];
  Row r;
  r.bytes = count * sizeof(float);
  r.count = count;
  r.time_us = median * 1e6;
  r.algbw = static_cast<double>(r.bytes) / median / 1e9;
  r.busbw = r.algbw * bus_factor();
  r.vs_mpi = mpi_t / median;
  return r;
}

Row Bench::codec_row(std::size_t count, const std::string& spec, double mpi_t) {
  if (compression::parse_codec_spec(spec).name == "powersgd") return powersgd_row(count, spec, mpi_t);
  const auto codec = compression::make_codec(spec);
  const auto [in, out, exact] = codec_buffers(count);
  auto normal = [count](float* v, int rank) { normal_fill(v, count, rank); };
  compression::CodecState st(7, rank_, p_);
  const std::vector<double> t =
      timed_calls(o_.warmup, [&, in = in, out = out] { comm_.allreduce_compressed(in, out, count, *codec, st); });
  // One more call from a fresh state, for the error and the check.
  compression::CodecState fresh(11, rank_, p_);
  comm_.allreduce_compressed(in, out, count, *codec, fresh);
  Row r = codec_timing(count, t, mpi_t);
  r.rel_err = relative_l2(out, exact, count);
  r.algo = fmt::format("C:{}", codec->name());
  r.codec = codec->name();
  r.wire_bytes = codec->payload_bytes(count) + codec->scale_count(count) * sizeof(float);
  r.ratio = r.wire_bytes ? static_cast<double>(r.bytes) / static_cast<double>(r.wire_bytes) : 0.0;
  r.check = o_.check ? (check_codec(*codec, count, out, normal) ? "ok" : "FAIL") : "-";
  return r;
}

std::pair<std::size_t, std::size_t> Bench::matrix_shape(std::size_t count) {
  std::size_t rows = 1;
  for (std::size_t d = 1; d * d <= count; ++d)
    if (count % d == 0) rows = d;
  return {rows, count == 0 ? 0 : count / rows};
}

Row Bench::powersgd_row(std::size_t count, const std::string& spec, double mpi_t) {
  const compression::PowerSgd ps = compression::PowerSgd::from_spec(spec);
  const auto [rows, cols] = matrix_shape(count);
  const auto [in, out, exact] = codec_buffers(count);
  auto normal = [count](float* v, int rank) { normal_fill(v, count, rank); };
  compression::PowerSgdState st(7);
  const comm::PowerSgdTensor timed{in, out, rows, cols, &st};
  // At least one untimed call: the state's buffers are touched there.
  const std::vector<double> t = timed_calls(
      std::max(1, o_.warmup), [&] { comm_.allreduce_powersgd(std::span<const comm::PowerSgdTensor>(&timed, 1), ps); });
  compression::PowerSgdState fresh(11);
  const comm::PowerSgdTensor m{in, out, rows, cols, &fresh};
  comm_.allreduce_powersgd(std::span<const comm::PowerSgdTensor>(&m, 1), ps);
  Row r = codec_timing(count, t, mpi_t);
  r.rel_err = relative_l2(out, exact, count);
  r.algo = fmt::format("C:{}", ps.name());
  r.codec = fmt::format("{}@{}x{}", ps.name(), rows, cols);
  r.wire_bytes = ps.step_bytes(rows, cols, compression::PowerSgdState());  // the checked call's fresh state
  r.ratio = r.wire_bytes ? static_cast<double>(r.bytes) / static_cast<double>(r.wire_bytes) : 0.0;
  r.check = o_.check ? (check_powersgd(ps, rows, cols, out, normal) ? "ok" : "FAIL") : "-";
  return r;
}

template <class Fill>
bool Bench::check_powersgd(const compression::PowerSgd& ps, std::size_t rows, std::size_t cols, const float* out,
                           Fill fill) {
  const std::size_t n = rows * cols;
  float* ref = reinterpret_cast<float*>(expected_->data);
  float* x = reinterpret_cast<float*>(scratch_->data);
  std::vector<compression::PowerSgdState> st(static_cast<std::size_t>(p_), compression::PowerSgdState(11));
  std::vector<float> psum(ps.p_count(rows, cols)), qsum(ps.q_count(rows, cols)), tmp;
  std::vector<double> exact(n, 0.0);
  const bool compressed = ps.compressed_step(rows, cols, compression::PowerSgdState());
  int bad = 0;
  if (!compressed) {
    std::fill(ref, ref + n, 0.0f);
    for (int r = 0; r < p_; ++r) {
      fill(x, r);
      for (std::size_t i = 0; i < n; ++i) ref[i] += x[i];
    }
  } else {
    for (int r = 0; r < p_; ++r) {
      fill(x, r);
      for (std::size_t i = 0; i < n; ++i) exact[i] += x[i];
      tmp.assign(psum.size(), 0.0f);
      ps.compute_p(x, rows, cols, tmp.data(), st[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < tmp.size(); ++i) psum[i] += tmp[i];
    }
    for (int r = 0; r < p_; ++r) {
      fill(x, r);  // without error feedback compute_q reads rank r's gradient again, in place
      tmp.assign(qsum.size(), 0.0f);
      ps.compute_q(psum.data(), rows, cols, tmp.data(), st[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < tmp.size(); ++i) qsum[i] += tmp[i];
    }
    ps.decompress(qsum.data(), rows, cols, ref, st[0]);
  }
  double num = 0, den = 0, err = 0, mag = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
    if (compressed) {
      err += (out[i] - exact[i]) * (out[i] - exact[i]);
      mag += exact[i] * exact[i];
    }
  }
  bad = std::sqrt(num / std::max(den, 1e-30)) > 1e-4 || err > mag * (1 + 1e-6) ? 1 : 0;
  return !control_.any(bad != 0);
}

template <class Fill>
bool Bench::check_codec(const compression::Codec& codec, std::size_t count, const float* out, Fill fill) {
  float* ref = reinterpret_cast<float*>(expected_->data);
  float* x = reinterpret_cast<float*>(scratch_->data);
  std::vector<compression::CodecState> st;
  for (int r = 0; r < p_; ++r) st.emplace_back(11, r, p_);
  std::vector<float> scales(codec.scale_count(count), 0.0f), local(scales.size());
  for (int r = 0; r < p_; ++r) {
    fill(x, r);
    codec.local_scales(x, count, local.data(), st[static_cast<std::size_t>(r)]);
    for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = std::max(scales[i], local[i]);
  }
  std::vector<std::byte> payload(codec.payload_bytes(count));
  std::fill(ref, ref + count, 0.0f);
  for (int r = 0; r < p_; ++r) {
    fill(x, r);
    codec.encode(x, count, payload.data(), st[static_cast<std::size_t>(r)], scales.empty() ? nullptr : scales.data());
    codec.decode_add(payload.data(), count, ref, st[static_cast<std::size_t>(r)],
                     scales.empty() ? nullptr : scales.data());
  }
  const std::string name = codec.name();
  const double ulp = name.rfind("fp16", 0) == 0   ? std::ldexp(1.0, -10)
                     : name.rfind("bf16", 0) == 0 ? std::ldexp(1.0, -7)
                                                  : 1e-6;
  int bad = 0;
  for (std::size_t i = 0; i < count && !bad; ++i)
    bad = std::abs(out[i] - ref[i]) > ulp * p_ * (std::abs(ref[i]) + 4.0) ? 1 : 0;
  return !control_.any(bad != 0);
}

}  // namespace hopwise::bench
