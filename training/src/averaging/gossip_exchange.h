// Gossip's exchange (averaging:gossip): each round every rank sends its model to its partner on the planned ring
// and receives the partner's (point to point on the transport, tags reserved_tags("gossip") + the round's index in the
// step); mixing waits for both. With a codec the message is the model's difference from the last common model (the one
// full_average() left), encoded with the sender's own scales: each rank mixes with x_i += w (D_j - D_i), D the
// decoded differences, its own included, so a pair's sum (and the job's mean) is kept exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hopwise/comm/transport.h"
#include "hopwise/compression/codec.h"
#include "hopwise/training/averaging.h"

namespace hopwise::comm::detail {

class GossipExchange {
 public:
  GossipExchange(Communicator& comm, const AveragingSpec& spec, float* params, std::size_t count);
  ~GossipExchange();
  // Posts the exchanges of step `step` (0-based): rounds step*K .. step*K+K-1, K = partners per step. The
  // parameters must not change until finish_and_mix() (they are sent from where they are).
  void start(std::int64_t step);
  // Waits for the exchanges started last and mixes: x = w ((K + 1 - m) x + sum of the m partners' x), w = 1/(K+1)
  // (with a codec: x += w (sum D_j - m D_i)). Nothing to do when nothing is in flight.
  void finish_and_mix();
  void drop();  // waits for the exchanges in flight and forgets them
  bool in_flight() const { return in_flight_; }
  int partners() const;  // in the exchange started last
  std::size_t bytes_sent_per_round() const { return message_bytes_; }
  void set_reference();  // the parameters now are every rank's common model (the codec's reference)

 private:
  struct Slot {
    int rank = -1;              // partner, -1: none this round
    std::vector<std::byte> in;  // its message
  };
  void wait_all(const char* what);

  Communicator& comm_;
  Transport& transport_;
  float* params_;
  std::size_t count_;
  int per_step_ = 1;
  int first_tag_ = 0;  // reserved_tags("gossip").first
  int position_ = 0, n_ = 1;
  std::vector<Slot> slots_;
  std::vector<Request> requests_;
  bool in_flight_ = false;
  std::int64_t step_ = 0;
  // codec (none: the parameters travel as they are)
  std::unique_ptr<compression::Codec> codec_;
  compression::CodecState state_;
  std::size_t scale_count_ = 0, message_bytes_ = 0;
  std::vector<float> reference_, diff_, own_decoded_, peer_decoded_;
  std::vector<std::byte> out_;  // this rank's message: scales, then payload
};

}  // namespace hopwise::comm::detail
