// The compressed allreduce, written once for host and device memory: agree on the scales where the codec needs
// them (a max-allreduce), encode, move the payloads (allreduce them where the codec's payloads add up, else
// allgather them and decode every rank's), and average. The Backend moves and codes the bytes:
//   std::size_t scale_count(), payload_bytes(), payload_count(), gather_stride(); bool aggregatable();
//   float* scales(); std::byte* payload(); std::byte* gathered();           // workspaces, grown by the backend
//   void local_scales(float* s); void allreduce_max(float* s, std::size_t k);
//   void encode(std::byte* p, const float* s); void allreduce_payload(std::byte* p);
//   void decode(const std::byte* p, const float* s); void decode_add(const std::byte* p, const float* s);
//   void allgather_payloads(const std::byte* mine, std::byte* all); void before_gathered_decode();
//   void divide_by_ranks(); void add_wire_bytes(std::size_t b);
#pragma once

#include <cstddef>

#include "hopwise/common/dtype.h"

namespace hopwise::comm::compressed {

template <class Backend>
void allreduce(Backend& b, std::size_t n, ReduceOp op, int ranks) {
  if (n == 0) return;
  const std::size_t k = b.scale_count();
  float* scales = k > 0 ? b.scales() : nullptr;
  if (k > 0) {
    b.local_scales(scales);
    b.allreduce_max(scales, k);
    b.add_wire_bytes(k * sizeof(float));
  }
  std::byte* payload = b.payload();
  b.encode(payload, scales);
  if (b.aggregatable()) {
    b.allreduce_payload(payload);
    b.decode(payload, scales);
  } else {
    std::byte* all = b.gathered();
    b.allgather_payloads(payload, all);
    b.before_gathered_decode();
    b.decode(all, scales);  // the first payload overwrites out (which may alias in)
    for (int r = 1; r < ranks; ++r) b.decode_add(all + static_cast<std::size_t>(r) * b.gather_stride(), scales);
  }
  b.add_wire_bytes(b.payload_bytes());
  if (op == ReduceOp::kAvg) b.divide_by_ranks();
}

}  // namespace hopwise::comm::compressed
