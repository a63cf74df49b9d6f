// HOPWISE_DEBUG=CHECK: before each collective every rank sends every other rank a fingerprint of the call it is
// about to make (collective, count, dtype, op, root, algorithm, codec) and compares them all, so that a rank
// calling with other arguments gets an error on every rank, naming the fields and the ranks that disagree,
// instead of a hang or silently wrong data. One round of small messages per call: a debugging aid, off by default.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/transport.h"
#include "hopwise/common/dtype.h"

namespace hopwise::comm {

// After a collective timed out here: each rank that gave up sends every other rank a note and listens for
// theirs for up to `listen`, so that every survivor can name the ranks it never heard from (stalled, dead, or
// not making this call), not only the neighbour it was waiting for. Returns that sentence ("" for one rank).
std::string explain_timeout(Transport& t, std::chrono::duration<double> listen);

// What a rank is about to call. Fields a collective does not use (op for allgather, root for allreduce, ...)
// are left out of the comparison.
struct CallSignature {
  Collective collective = Collective::kBarrier;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  Algorithm algorithm = Algorithm::kAuto;
  std::string_view codec;  // empty: none
};

class CollectiveCheck {
 public:
  // Exchanges `call` with every rank of `t` and throws InvalidArgument naming the disagreeing ranks and fields
  // when any rank's call differs (every rank throws the same), or TimeoutError naming ranks that never sent.
  void verify(Transport& t, const CallSignature& call);

  // The fixed-size form that travels (exposed for the description below).
  struct Wire {
    std::uint64_t seq = 0;  // this rank's number of checked calls so far: where in the program the call is
    std::uint64_t count = 0;
    std::uint64_t codec_hash = 0;
    std::int32_t collective = 0, dtype = 0, op = 0, root = 0, algorithm = 0, pad = 0;
    char codec[48] = {};  // the name, cut to fit (the hash compares the whole name)
  };
  static Wire to_wire(const CallSignature& call, std::uint64_t seq);
  // "" when every entry agrees; else the explanation, naming fields and ranks. Entry i is rank ranks[i] (by
  // default rank i); `source` says which check found it.
  static std::string describe_mismatch(const std::vector<Wire>& all, std::string_view source = "HOPWISE_DEBUG=CHECK",
                                       const std::vector<int>& ranks = {});

 private:
  std::uint64_t seq_ = 0;
  Wire mine_;
  std::vector<Wire> all_;
};

}  // namespace hopwise::comm
