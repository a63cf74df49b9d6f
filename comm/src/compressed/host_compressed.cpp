// The host Communicator's composite calls: the compressed allreduce and PowerSGD, each queued as one task whose
// job runs the shared recipe (compressed_recipe.h, powersgd_recipe.h) over plain collectives issued in place on
// the progress thread, with the host codecs and the communicator's workspace.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "../call_checks.h"
#include "../communicator_impl.h"
#include "compressed_recipe.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "powersgd_recipe.h"

namespace hopwise::comm {

namespace {

// Runs one codec call and adds its seconds to the communicator's codec time (what the monitor reports: on a few
// cores the codec competes with the compute thread).
template <class F>
void timed(detail::CommunicatorImpl& impl, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  impl.add_codec_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

class HostCodecBackend {
 public:
  HostCodecBackend(detail::CommunicatorImpl& impl, const compression::Codec& c, compression::CodecState& st,
                   const float* in, float* out, std::size_t n)
      : impl_(impl), c_(c), st_(st), in_(in), out_(out), n_(n) {}
  std::size_t scale_count() const { return c_.scale_count(n_); }
  std::size_t payload_bytes() const { return c_.payload_bytes(n_); }
  std::size_t gather_stride() const { return payload_bytes(); }
  bool aggregatable() const { return c_.pattern() == compression::Pattern::kAggregatable; }
  float* scales() {
    impl_.scratch_scales.assign(scale_count(), 0.0f);
    return impl_.scratch_scales.data();
  }
  std::byte* payload() { return static_cast<std::byte*>(impl_.workspace.get(Scratch::kPayload, payload_bytes() + 64)); }
  std::byte* gathered() {
    return static_cast<std::byte*>(
        impl_.workspace.get(Scratch::kGathered, payload_bytes() * static_cast<std::size_t>(impl_.p()) + 64));
  }
  void local_scales(float* s) {
    timed(impl_, [&] { c_.local_scales(in_, n_, s, st_); });
  }
  void allreduce_max(float* s, std::size_t k) {
    impl_.run_nested(Collective::kAllreduce, s, s, k, DataType::kFloat32, ReduceOp::kMax);
  }
  void encode(std::byte* p, const float* s) {
    timed(impl_, [&] { c_.encode(in_, n_, p, st_, s); });
  }
  void allreduce_payload(std::byte* p) {
    impl_.run_nested(Collective::kAllreduce, p, p, c_.payload_count(n_), c_.payload_dtype(), ReduceOp::kSum);
  }
  void allgather_payloads(const std::byte* mine, std::byte* all) {
    impl_.run_nested(Collective::kAllgather, mine, all, payload_bytes(), DataType::kUInt8, ReduceOp::kSum);
  }
  void before_gathered_decode() {}
  void decode(const std::byte* p, const float* s) {
    timed(impl_, [&] { c_.decode(p, n_, out_, st_, s); });
  }
  void decode_add(const std::byte* p, const float* s) {
    timed(impl_, [&] { c_.decode_add(p, n_, out_, st_, s); });
  }
  void divide_by_ranks() { scale_by(DataType::kFloat32, out_, n_, 1.0 / impl_.p()); }
  void add_wire_bytes(std::size_t b) { impl_.add_wire_bytes(b); }

 private:
  detail::CommunicatorImpl& impl_;
  const compression::Codec& c_;
  compression::CodecState& st_;
  const float* in_;
  float* out_;
  std::size_t n_;
};

class HostPowerSgdBackend {
 public:
  using M = PowerSgdTensor;
  HostPowerSgdBackend(detail::CommunicatorImpl& impl, const compression::PowerSgd& ps) : impl_(impl), ps_(ps) {}
  bool compressed_step(const M& m) const { return ps_.compressed_step(m.rows, m.cols, *m.state); }
  bool compresses(const M& m) const { return ps_.compresses(m.rows, m.cols); }
  void skip(const M& m) const { ps_.skip(*m.state); }
  std::size_t p_count(const M& m) const { return ps_.p_count(m.rows, m.cols); }
  std::size_t q_count(const M& m) const { return ps_.q_count(m.rows, m.cols); }
  // Every plain matrix packed into one buffer, one sum-allreduce (finish() averages).
  void allreduce_plain(const std::vector<const M*>& plain, ReduceOp) {
    std::size_t total = 0;
    for (const M* m : plain) total += m->rows * m->cols;
    auto* buf = static_cast<float*>(impl_.workspace.get(Scratch::kGathered, total * sizeof(float)));
    std::size_t at = 0;
    for (const M* m : plain) {
      if (m->rows * m->cols > 0)  // an empty matrix's data() may be null: memcpy from null is undefined
        std::memcpy(buf + at, m->in, m->rows * m->cols * sizeof(float));
      at += m->rows * m->cols;
    }
    impl_.run_nested(Collective::kAllreduce, buf, buf, total, DataType::kFloat32, ReduceOp::kSum);
    at = 0;
    for (const M* m : plain) {
      if (m->rows * m->cols > 0) std::memcpy(m->out, buf + at, m->rows * m->cols * sizeof(float));
      at += m->rows * m->cols;
    }
  }
  float* factors(std::size_t floats) {
    return static_cast<float*>(impl_.workspace.get(Scratch::kPayload, floats * sizeof(float)));
  }
  void compute_p(const M& m, float* p) {
    timed(impl_, [&] { ps_.compute_p(m.in, m.rows, m.cols, p, *m.state); });
  }
  void compute_q(const float* p, const M& m, float* q) {
    timed(impl_, [&] { ps_.compute_q(p, m.rows, m.cols, q, *m.state); });
  }
  void decompress(const float* q, const M& m) {
    timed(impl_, [&] { ps_.decompress(q, m.rows, m.cols, m.out, *m.state); });
  }
  void allreduce_p(float* p, std::size_t n) { sum(p, n); }
  void allreduce_q(float* q, std::size_t n, ReduceOp) { sum(q, n); }
  void add_wire_bytes(std::size_t b) { impl_.add_wire_bytes(b); }
  void finish(std::span<const M> all, ReduceOp op) {
    if (op == ReduceOp::kAvg)
      for (const M& m : all) scale_by(DataType::kFloat32, m.out, m.rows * m.cols, 1.0 / impl_.p());
  }

 private:
  void sum(float* x, std::size_t n) {
    impl_.run_nested(Collective::kAllreduce, x, x, n, DataType::kFloat32, ReduceOp::kSum);
  }
  detail::CommunicatorImpl& impl_;
  const compression::PowerSgd& ps_;
};

Task compressed_task(int rank, const float* in, float* out, std::size_t count, const compression::Codec& codec,
                     compression::CodecState& state, ReduceOp op) {
  checks::sum_or_avg("allreduce_compressed", op, "codecs sum");
  checks::buffers("allreduce_compressed", in, count, out, count, DataType::kFloat32, rank);
  Task t{Collective::kAllreduce, in, out, count, DataType::kFloat32, op};
  t.compression = codec.name();
  t.job = [in, out, count, &codec, &state, op](detail::CommunicatorImpl& impl) {
    HostCodecBackend b(impl, codec, state, in, out, count);
    compressed::allreduce(b, count, op, impl.p());
  };
  return t;
}

Task powersgd_task(int rank, std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps, ReduceOp op) {
  checks::sum_or_avg("allreduce_powersgd", op, "PowerSGD sums");
  Task t{Collective::kAllreduce, nullptr, nullptr, 0, DataType::kFloat32, op};
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const PowerSgdTensor& m = tensors[i];
    const std::size_t n = m.rows * m.cols;
    if (m.state == nullptr)
      throw InvalidArgument(
          fmt::format("allreduce_powersgd: matrix {} ({} x {}) on rank {} has no state; keep one "
                      "compression::PowerSgdState per matrix across steps",
                      i, m.rows, m.cols, rank));
    checks::buffers(fmt::format("allreduce_powersgd (matrix {})", i), m.in, n, m.out, n, DataType::kFloat32, rank);
    t.count += n;
  }
  t.compression = ps.name();
  t.extra = fmt::format(", matrices={}", tensors.size());
  t.job = [matrices = std::vector<PowerSgdTensor>(tensors.begin(), tensors.end()), &ps,
           op](detail::CommunicatorImpl& impl) {
    HostPowerSgdBackend b(impl, ps);
    compressed::powersgd_allreduce(b, std::span<const PowerSgdTensor>(matrices), op);
  };
  return t;
}

}  // namespace

Work Communicator::allreduce_compressed_async(const float* in, float* out, std::size_t count,
                                              const compression::Codec& codec, compression::CodecState& state,
                                              ReduceOp op) {
  return impl_->submit(compressed_task(rank(), in, out, count, codec, state, op));
}

void Communicator::allreduce_compressed(const float* in, float* out, std::size_t count, const compression::Codec& codec,
                                        compression::CodecState& state, ReduceOp op) {
  impl_->run_sync(compressed_task(rank(), in, out, count, codec, state, op));
}

Work Communicator::allreduce_powersgd_async(std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                                            ReduceOp op) {
  return impl_->submit(powersgd_task(rank(), tensors, ps, op));
}

void Communicator::allreduce_powersgd(std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                                      ReduceOp op) {
  impl_->run_sync(powersgd_task(rank(), tensors, ps, op));
}

}  // namespace hopwise::comm
