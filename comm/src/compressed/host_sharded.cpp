// The host Communicator's compressed reduce-scatter and allgather, for sharded training (FSDP, ZeRO): each queued as
// one task whose job encodes with the host codecs, moves the payloads and decodes, on the progress thread.
//
// Reduce-scatter: every rank encodes the block bound for each rank once, with its own scales and that block's own
// codec state (so error feedback keeps a residual per destination), the payloads travel straight to their owners
// (pairwise, all at once), and each owner decodes the p payloads of its block in float32 and adds them. A payload
// is decoded exactly once, so quantization error is not compounded hop by hop as a ring that re-encodes partial
// sums would compound it (ZeRO++'s lesson for its int4 gradients); the owner's own block takes the same codec round
// trip, so error feedback treats every block alike. Allgather: each rank encodes its block once with its own
// scales, the payloads are all-gathered, and every rank decodes every block, its own too, so that all ranks hold
// the same values. Payloads are decoded one by one, never summed as bytes, so int8 keeps its whole range
// (state.world_size is set to 1).
#include <fmt/core.h>

#include <algorithm>
#include <span>
#include <vector>

#include "../algorithms/algorithms.h"
#include "../call_checks.h"
#include "../communicator_impl.h"
#include "codec_seconds.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/compression/codec.h"

namespace hopwise::comm {

namespace {

// One block's message: [scale_count floats][payload], padded to 8 bytes so that every message in a buffer of them
// starts aligned for the scales and for payloads read in words (topk's indices).
struct Message {
  std::size_t scales = 0, payload = 0, stride = 0;
  Message(const compression::Codec& c, std::size_t n)
      : scales(c.scale_count(n)), payload(c.payload_bytes(n)), stride((scales * sizeof(float) + payload + 7) / 8 * 8) {}
  static float* scales_of(std::byte* m) { return reinterpret_cast<float*>(m); }
  std::byte* payload_of(std::byte* m) const { return m + scales * sizeof(float); }
};

using compressed::timed;

// Encodes n floats into message m with this rank's own scales.
void encode_message(detail::CommunicatorImpl& impl, const compression::Codec& codec, compression::CodecState& st,
                    const float* in, std::size_t n, const Message& shape, std::byte* m) {
  st.world_size = 1;  // decoded one by one, never summed as bytes
  float* s = shape.scales > 0 ? Message::scales_of(m) : nullptr;
  timed(impl, [&] {
    if (s) codec.local_scales(in, n, s, st);
    codec.encode(in, n, shape.payload_of(m), st, s);
  });
}

void decode_message(detail::CommunicatorImpl& impl, const compression::Codec& codec, const compression::CodecState& st,
                    std::byte* m, std::size_t n, const Message& shape, float* out, bool add) {
  const float* s = shape.scales > 0 ? Message::scales_of(m) : nullptr;
  timed(impl, [&] {
    if (add)
      codec.decode_add(shape.payload_of(m), n, out, st, s);
    else
      codec.decode(shape.payload_of(m), n, out, st, s);
  });
}

void reduce_scatter_job(detail::CommunicatorImpl& impl, const float* in, float* out, std::size_t n,
                        const compression::Codec& codec, std::span<compression::CodecState> states, ReduceOp op) {
  Transport& t = *impl.transport;
  const int p = t.size(), me = t.rank();
  const auto up = static_cast<std::size_t>(p);
  if (n == 0) return;
  const Message shape(codec, n);
  auto* mine = static_cast<std::byte*>(impl.workspace.get(Scratch::kPayload, shape.stride * up + 64));
  auto* theirs = static_cast<std::byte*>(impl.workspace.get(Scratch::kGathered, shape.stride * up + 64));
  for (int d = 0; d < p; ++d)
    encode_message(impl, codec, states[static_cast<std::size_t>(d)], in + static_cast<std::size_t>(d) * n, n, shape,
                   mine + static_cast<std::size_t>(d) * shape.stride);
  const std::size_t piece = impl.options.chunk_bytes;
  {
    Requests reqs(t);
    for (int k = 1; k < p; ++k) {
      const int from = (me - k + p) % p;
      for (std::size_t j = 0; j < shape.stride; j += piece)
        reqs.push_back(t.irecv(theirs + static_cast<std::size_t>(from) * shape.stride + j,
                               std::min(piece, shape.stride - j), from, algo::kTagShardedExchange));
    }
    for (int k = 1; k < p; ++k) {
      const int to = (me + k) % p;  // staggered, so that not every rank sends to rank 0 first
      for (std::size_t j = 0; j < shape.stride; j += piece)
        reqs.push_back(t.isend(mine + static_cast<std::size_t>(to) * shape.stride + j,
                               std::min(piece, shape.stride - j), to, algo::kTagShardedExchange));
    }
    t.wait_all(reqs);
  }
  const compression::CodecState& st = states[static_cast<std::size_t>(me)];  // the block's: randomk's indices
  for (int r = 0; r < p; ++r) {
    std::byte* m = (r == me ? mine : theirs) + static_cast<std::size_t>(r) * shape.stride;
    decode_message(impl, codec, st, m, n, shape, out, r > 0);
  }
  impl.add_wire_bytes(shape.stride * (up - 1));
  if (op == ReduceOp::kAvg) scale_by(DataType::kFloat32, out, n, 1.0 / p);
}

void allgather_job(detail::CommunicatorImpl& impl, const float* in, float* out, std::size_t n,
                   const compression::Codec& codec, compression::CodecState& state) {
  const int p = impl.p();
  const auto up = static_cast<std::size_t>(p);
  if (n == 0) return;
  const Message shape(codec, n);
  auto* mine = static_cast<std::byte*>(impl.workspace.get(Scratch::kPayload, shape.stride + 64));
  auto* all = static_cast<std::byte*>(impl.workspace.get(Scratch::kGathered, shape.stride * up + 64));
  encode_message(impl, codec, state, in, n, shape, mine);  // before `out` is written: `in` may be a block of it
  impl.run_nested(Collective::kAllgather, mine, all, shape.stride, DataType::kUInt8, ReduceOp::kSum);
  for (int r = 0; r < p; ++r)
    decode_message(impl, codec, state, all + static_cast<std::size_t>(r) * shape.stride, n, shape,
                   out + static_cast<std::size_t>(r) * n, false);
  impl.add_wire_bytes(shape.stride * (up - 1));
}

Task compressed_reduce_scatter_task(int rank, int size, const float* in, float* out, std::size_t recvcount,
                                    const compression::Codec& codec, std::span<compression::CodecState> states,
                                    ReduceOp op) {
  constexpr std::string_view what = "reduce_scatter_compressed";
  checks::sum_or_avg(what, op, "codecs sum");
  const std::size_t all = checks::times_ranks(what, recvcount, size, rank);
  checks::buffers(what, in, all, out, recvcount, DataType::kFloat32, rank);
  if (states.size() != static_cast<std::size_t>(size))
    throw InvalidArgument(
        fmt::format("{}: rank {} passed {} codec states; pass one per rank ({}), each kept for its "
                    "block across calls (its error-feedback residual)",
                    what, rank, states.size(), size));
  Task t{Collective::kReduceScatter, in, out, recvcount, DataType::kFloat32, op};
  t.compression = codec.name();
  t.job = [in, out, recvcount, &codec, states, op](detail::CommunicatorImpl& impl) {
    reduce_scatter_job(impl, in, out, recvcount, codec, states, op);
  };
  return t;
}

Task compressed_allgather_task(int rank, int size, const float* in, float* out, std::size_t sendcount,
                               const compression::Codec& codec, compression::CodecState& state) {
  constexpr std::string_view what = "allgather_compressed";
  const std::size_t all = checks::times_ranks(what, sendcount, size, rank);
  checks::buffers(what, in, sendcount, out, all, DataType::kFloat32, rank);
  Task t{Collective::kAllgather, in, out, sendcount, DataType::kFloat32, ReduceOp::kSum};
  t.compression = codec.name();
  t.job = [in, out, sendcount, &codec, &state](detail::CommunicatorImpl& impl) {
    allgather_job(impl, in, out, sendcount, codec, state);
  };
  return t;
}

}  // namespace

Work Communicator::reduce_scatter_compressed_async(const float* in, float* out, std::size_t recvcount,
                                                   const compression::Codec& codec,
                                                   std::span<compression::CodecState> states, ReduceOp op) {
  return impl_->submit(compressed_reduce_scatter_task(rank(), size(), in, out, recvcount, codec, states, op));
}

void Communicator::reduce_scatter_compressed(const float* in, float* out, std::size_t recvcount,
                                             const compression::Codec& codec, std::span<compression::CodecState> states,
                                             ReduceOp op) {
  impl_->run_sync(compressed_reduce_scatter_task(rank(), size(), in, out, recvcount, codec, states, op));
}

Work Communicator::allgather_compressed_async(const float* in, float* out, std::size_t sendcount,
                                              const compression::Codec& codec, compression::CodecState& state) {
  return impl_->submit(compressed_allgather_task(rank(), size(), in, out, sendcount, codec, state));
}

void Communicator::allgather_compressed(const float* in, float* out, std::size_t sendcount,
                                        const compression::Codec& codec, compression::CodecState& state) {
  impl_->run_sync(compressed_allgather_task(rank(), size(), in, out, sendcount, codec, state));
}

}  // namespace hopwise::comm
