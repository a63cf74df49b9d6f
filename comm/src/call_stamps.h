// The default call check: every collective a rank runs carries a stamp of the call (its number on the
// communicator, collective, count, dtype, op, root, codec, algorithm), and the ranks compare stamps where they
// already meet, so that a rank calling with other arguments, or skipping a call, gets an error naming the field
// and the ranks instead of silently wrong data. No extra round trip: the stamp travels as a small message beside
// the first message to each peer (posted with it, waited for with it), or in the shared slots' header where the
// algorithm moves no messages. HOPWISE_CALL_CHECK=0 turns it off; HOPWISE_DEBUG=CHECK still compares every call
// between every pair of ranks before any data moves.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "collective_check.h"
#include "hopwise/comm/transport.h"

namespace hopwise::comm {

CallStamp stamp_of(const CallSignature& call, std::uint64_t seq);

// "" when the stamps agree; else what differs (the call numbers: a skipped call; the fields: the caller's
// mismatch; only the algorithm: a tuner fault). Entry i is rank ranks[i].
std::string describe_stamps(const std::vector<CallStamp>& all, const std::vector<int>& ranks);

// Abandons `t` (data may be in flight to or from a rank that called something else) and throws InvalidArgument.
[[noreturn]] void throw_stamp_mismatch(Transport& t, const std::string& why);

// The view of a transport that one collective runs through: forwards everything, and on the first message to or
// from each peer in the run also sends or receives a stamp, checked before any receive from that peer is
// reported complete.
class StampedTransport final : public Transport {
 public:
  explicit StampedTransport(Transport& inner);
  ~StampedTransport() override;

  void begin(const CallStamp& stamp);  // a run starts
  void end();                          // it succeeded: the stamps sent are waited for, every one received checked
  void abort();                        // it failed: stamps in flight are withdrawn (their buffers never reused)
  // Compares stamps with `from` and `to` right now: for a library's own collective, which moves no messages of ours.
  void exchange_with(int from, int to);
  const CallStamp& current() const { return *sending_; }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  Request isend(const void* buf, std::size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, std::size_t bytes, int peer, int tag) override;
  void wait_all(std::span<Request> reqs) override;
  bool test(Request& r) override;
  void cancel(Request& r) override { inner_.cancel(r); }
  std::optional<int> probe_any(int tag) override { return inner_.probe_any(tag); }
  bool has_probe() const override { return inner_.has_probe(); }
  int local_rank() const override { return inner_.local_rank(); }
  int local_size() const override { return inner_.local_size(); }
  int host_id() const override { return inner_.host_id(); }
  SharedSlots* shared_slots() override { return inner_.shared_slots(); }
  NativeCollectives* native() override { return inner_.native(); }
  const CallStamp* call_stamp() const override { return sending_.get(); }
  bool peer_gone(int peer) const override { return inner_.peer_gone(peer); }
  void progress() override { inner_.progress(); }
  std::optional<std::vector<int>> ranks_that_gave_up(std::chrono::duration<double> listen) override {
    return inner_.ranks_that_gave_up(listen);
  }
  void abandon() override { inner_.abandon(); }
  void declare_lost(int peer) override { inner_.declare_lost(peer); }
  std::uint64_t sent_to(int peer) const override { return inner_.sent_to(peer); }

 private:
  struct Incoming {
    int peer = -1;
    Request req;
    CallStamp theirs;
    bool claimed = false;  // a thread is waiting for it (ring channels share a peer)
    bool checked = false;
  };
  void post_stamp_send(int peer);         // under mu_
  Incoming* post_stamp_recv(int peer);    // under mu_
  void check_before_receiving(int peer);  // waits for the peer's stamp if none has been checked, and checks it
  void check(const Incoming& in);
  void withdraw(std::span<Request> reqs);  // cancels the active ones and leaves them inactive

  Transport& inner_;
  std::unique_ptr<CallStamp>
      sending_;  // what this run's stamps send (replaced after a failure: sends may still read it)
  std::mutex mu_;
  std::uint64_t epoch_ = 0;                             // runs so far
  std::vector<std::uint64_t> sent_epoch_, recv_epoch_;  // per peer: the run that last stamped it
  std::vector<Incoming*> incoming_of_;                  // per peer: this run's stamp from it
  std::vector<std::unique_ptr<Incoming>> pool_;         // reused run after run; stable addresses for the receives
  std::size_t used_ = 0;
  std::vector<Request> sends_;
};

// One run under a stamp: begin() now, abort() unless finish() was reached.
class StampedRun {
 public:
  StampedRun(StampedTransport* t, const CallStamp& s) : t_(t) {
    if (t_) t_->begin(s);
  }
  void finish() {
    if (t_) t_->end();
    t_ = nullptr;
  }
  ~StampedRun() {
    if (t_) t_->abort();
  }
  StampedRun(const StampedRun&) = delete;
  StampedRun& operator=(const StampedRun&) = delete;

 private:
  StampedTransport* t_;
};

}  // namespace hopwise::comm
