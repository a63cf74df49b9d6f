// The host Communicator's composite calls: the compressed allreduce and PowerSGD, each queued as one task whose
// job runs the shared recipe (compressed_recipe.h, powersgd_recipe.h) over plain collectives issued in place on
// the progress thread, with the host codecs and the communicator's workspace. Under CompressionScope::kNetwork the
// recipe runs among the hosts' leaders only, between a full-precision reduce within each host and a broadcast.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string_view>

#include "../algorithms/algorithms.h"
#include "../call_checks.h"
#include "../communicator_impl.h"
#include "codec_seconds.h"
#include "compressed_recipe.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "powersgd_recipe.h"

namespace hopwise::comm {

namespace {

using compressed::timed;

// Where a recipe's collectives run: over the world, nested in the running task (dispatch picks the algorithm), or
// among the hosts' leaders, a ring over the plan's leader group (the network stage).
class Collectives {
 public:
  Collectives(detail::CommunicatorImpl& impl, const algo::Context* leaders) : impl_(impl), leaders_(leaders) {}
  int ranks() const { return leaders_ ? leaders_->transport.size() : impl_.p(); }
  void allreduce(void* buf, std::size_t n, DataType dt, ReduceOp op) {
    if (!leaders_)
      impl_.run_nested(Collective::kAllreduce, buf, buf, n, dt, op);
    else
      algo::ring_allreduce(*leaders_, buf, buf, n, dt, op, 1.0, topology::identity_ring(ranks()));
  }
  void allgather(const std::byte* mine, std::byte* all, std::size_t bytes) {
    if (!leaders_)
      impl_.run_nested(Collective::kAllgather, mine, all, bytes, DataType::kUInt8, ReduceOp::kSum);
    else
      algo::ring_allgather(*leaders_, mine, all, bytes, DataType::kUInt8, topology::identity_ring(ranks()));
  }

 private:
  detail::CommunicatorImpl& impl_;
  const algo::Context* leaders_;
};

class HostCodecBackend {
 public:
  HostCodecBackend(detail::CommunicatorImpl& impl, const compression::Codec& c, compression::CodecState& st,
                   const float* in, float* out, std::size_t n, Collectives coll)
      : impl_(impl), c_(c), st_(st), in_(in), out_(out), n_(n), coll_(coll) {}
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
        impl_.workspace.get(Scratch::kGathered, payload_bytes() * static_cast<std::size_t>(coll_.ranks()) + 64));
  }
  void local_scales(float* s) {
    timed(impl_, [&] { c_.local_scales(in_, n_, s, st_); });
  }
  void allreduce_max(float* s, std::size_t k) { coll_.allreduce(s, k, DataType::kFloat32, ReduceOp::kMax); }
  void encode(std::byte* p, const float* s) {
    timed(impl_, [&] { c_.encode(in_, n_, p, st_, s); });
  }
  void allreduce_payload(std::byte* p) { coll_.allreduce(p, c_.payload_count(n_), c_.payload_dtype(), ReduceOp::kSum); }
  void allgather_payloads(const std::byte* mine, std::byte* all) { coll_.allgather(mine, all, payload_bytes()); }
  void before_gathered_decode() {}
  void decode(const std::byte* p, const float* s) {
    timed(impl_, [&] { c_.decode(p, n_, out_, st_, s); });
  }
  void decode_add(const std::byte* p, const float* s) {
    timed(impl_, [&] { c_.decode_add(p, n_, out_, st_, s); });
  }
  void divide_by_ranks() { scale_by(DataType::kFloat32, out_, n_, 1.0 / coll_.ranks()); }
  void add_wire_bytes(std::size_t b) { impl_.add_wire_bytes(b); }

 private:
  detail::CommunicatorImpl& impl_;
  const compression::Codec& c_;
  compression::CodecState& st_;
  const float* in_;
  float* out_;
  std::size_t n_;
  Collectives coll_;
};

class HostPowerSgdBackend {
 public:
  using M = PowerSgdTensor;
  HostPowerSgdBackend(detail::CommunicatorImpl& impl, const compression::PowerSgd& ps, Collectives coll)
      : impl_(impl), ps_(ps), coll_(coll) {}
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
    coll_.allreduce(buf, total, DataType::kFloat32, ReduceOp::kSum);
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
      for (const M& m : all) scale_by(DataType::kFloat32, m.out, m.rows * m.cols, 1.0 / coll_.ranks());
  }

 private:
  void sum(float* x, std::size_t n) { coll_.allreduce(x, n, DataType::kFloat32, ReduceOp::kSum); }
  detail::CommunicatorImpl& impl_;
  const compression::PowerSgd& ps_;
  Collectives coll_;
};

// The network stage's frame: each host's sum gathered at full precision on its leader (a pipelined tree over the
// host's ranks), the leaders' ring for the recipe, and the result broadcast back within each host.
class NetworkStage {
 public:
  explicit NetworkStage(detail::CommunicatorImpl& impl) : impl_(impl), plan_(impl.plan) {
    plan_.make_groups(*impl.transport);
    local_.emplace(algo::Context{*plan_.host_group, impl.workspace, impl.options.chunk_bytes});
    if (plan_.leader_group && plan_.leader_group->size() > 1)
      leaders_.emplace(
          algo::Context{*plan_.leader_group, impl.workspace, impl.options.chunk_bytes, 0, impl.ring_send_window()});
  }
  // The leaders' collectives; null on a rank that is not its host's leader, or where there is one host.
  const algo::Context* leaders() const { return leaders_ ? &*leaders_ : nullptr; }
  void reduce_to_leader(const float* in, float* out, std::size_t n) {
    if (plan_.host_group->size() > 1)
      algo::tree_reduce(*local_, in, out, n, DataType::kFloat32, ReduceOp::kSum, 1.0, plan_.host_tree);
    else if (in != out && n > 0)
      std::memcpy(out, in, n * sizeof(float));
  }
  void broadcast_from_leader(float* out, std::size_t n, ReduceOp op) {
    if (plan_.host_group->size() > 1) algo::tree_broadcast(*local_, out, n, DataType::kFloat32, plan_.host_tree);
    if (op == ReduceOp::kAvg) scale_by(DataType::kFloat32, out, n, 1.0 / impl_.p());
  }

 private:
  detail::CommunicatorImpl& impl_;
  detail::PlanState& plan_;
  std::optional<algo::Context> local_, leaders_;
};

Task compressed_task(int rank, const float* in, float* out, std::size_t count, const compression::Codec& codec,
                     compression::CodecState& state, ReduceOp op, CompressionScope scope) {
  checks::sum_or_avg("allreduce_compressed", op, "codecs sum");
  checks::buffers("allreduce_compressed", in, count, out, count, DataType::kFloat32, rank);
  Task t{Collective::kAllreduce, in, out, count, DataType::kFloat32, op};
  t.compression = codec.name();
  if (scope == CompressionScope::kWorld) {
    t.job = [in, out, count, &codec, &state, op](detail::CommunicatorImpl& impl) {
      HostCodecBackend b(impl, codec, state, in, out, count, Collectives(impl, nullptr));
      compressed::allreduce(b, count, op, impl.p());
    };
    return t;
  }
  t.compression = "network:" + t.compression;
  t.job = [in, out, count, &codec, &state, op](detail::CommunicatorImpl& impl) {
    NetworkStage stage(impl);
    stage.reduce_to_leader(in, out, count);
    if (const algo::Context* leaders = stage.leaders()) {
      state.rank = leaders->transport.rank();  // the codec sums the hosts' payloads, not the ranks'
      state.world_size = leaders->transport.size();
      HostCodecBackend b(impl, codec, state, out, out, count, Collectives(impl, leaders));
      compressed::allreduce(b, count, ReduceOp::kSum, state.world_size);
    }
    stage.broadcast_from_leader(out, count, op);
  };
  return t;
}

Task powersgd_task(int rank, std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps, ReduceOp op,
                   CompressionScope scope) {
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
  if (scope == CompressionScope::kWorld) {
    t.job = [matrices = std::vector<PowerSgdTensor>(tensors.begin(), tensors.end()), &ps,
             op](detail::CommunicatorImpl& impl) {
      HostPowerSgdBackend b(impl, ps, Collectives(impl, nullptr));
      compressed::powersgd_allreduce(b, std::span<const PowerSgdTensor>(matrices), op);
    };
    return t;
  }
  t.compression = "network:" + t.compression;
  t.job = [matrices = std::vector<PowerSgdTensor>(tensors.begin(), tensors.end()), &ps,
           op](detail::CommunicatorImpl& impl) {
    NetworkStage stage(impl);
    std::vector<PowerSgdTensor> sums = matrices;  // each host's sum, in place in `out`
    for (PowerSgdTensor& m : sums) {
      stage.reduce_to_leader(m.in, m.out, m.rows * m.cols);
      m.in = m.out;
    }
    if (const algo::Context* leaders = stage.leaders()) {
      HostPowerSgdBackend b(impl, ps, Collectives(impl, leaders));
      compressed::powersgd_allreduce(b, std::span<const PowerSgdTensor>(sums), ReduceOp::kSum);
    }
    for (PowerSgdTensor& m : sums) stage.broadcast_from_leader(m.out, m.rows * m.cols, op);
  };
  return t;
}

}  // namespace

std::pair<CompressionScope, std::string> split_compression_scope(const std::string& spec) {
  constexpr std::string_view prefix = "network:";
  if (spec.rfind(prefix, 0) != 0) return {CompressionScope::kWorld, spec};
  std::string codec = spec.substr(prefix.size());
  if (codec.empty() || codec == "none")
    throw InvalidArgument(
        fmt::format("compression '{}': name the codec for the links between hosts after "
                    "'network:', e.g. network:int8, network:fp16 or network:powersgd:rank=4",
                    spec));
  return {CompressionScope::kNetwork, std::move(codec)};
}

Work Communicator::allreduce_compressed_async(const float* in, float* out, std::size_t count,
                                              const compression::Codec& codec, compression::CodecState& state,
                                              ReduceOp op, CompressionScope scope) {
  return impl_->submit(compressed_task(rank(), in, out, count, codec, state, op, scope));
}

void Communicator::allreduce_compressed(const float* in, float* out, std::size_t count, const compression::Codec& codec,
                                        compression::CodecState& state, ReduceOp op, CompressionScope scope) {
  impl_->run_sync(compressed_task(rank(), in, out, count, codec, state, op, scope));
}

Work Communicator::allreduce_powersgd_async(std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                                            ReduceOp op, CompressionScope scope) {
  return impl_->submit(powersgd_task(rank(), tensors, ps, op, scope));
}

void Communicator::allreduce_powersgd(std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                                      ReduceOp op, CompressionScope scope) {
  impl_->run_sync(powersgd_task(rank(), tensors, ps, op, scope));
}

}  // namespace hopwise::comm
