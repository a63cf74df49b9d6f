// The default call check: every collective a rank runs carries a stamp of the call (its number on the
// communicator, collective, count, dtype, op, root, codec, algorithm), and the ranks compare stamps where they
// already meet, so that a rank calling with other arguments, or skipping a call, gets an error naming the field
// and the ranks instead of silently wrong data. No extra round trip: each run sends each peer one message on
// kTagStamp led by the stamp, which is its first message itself for a small call and a header of its own, posted
// beside the first message, for a larger one; where the algorithm moves no messages the stamp sits in the shared
// slots' header. HOPWISE_CALL_CHECK=0 turns it off; HOPWISE_DEBUG=CHECK still compares every call
// between every pair of ranks before any data moves.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
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

// The view of a transport that one collective runs through: forwards everything and stamps each run's messages.
// Every run's first message to each peer goes on kTagStamp, led by a 64-byte header (the stamp, the message's tag
// and size). A small call (begin's `carry`) sends that message's bytes after the header: its first receive from
// each peer takes it into a buffer of its own, checks the stamp, and moves the bytes on. A larger call sends the
// header alone beside its first message, and no receive from that peer is reported complete before the header is
// checked. Either way the stamps of calls that differ in collective or algorithm (and so in tags) still meet.
class StampedTransport final : public Transport {
 public:
  explicit StampedTransport(Transport& inner);
  ~StampedTransport() override;

  // A run starts. `carry`: a small call whose messages to and from each peer are sent and received in one order
  // (one thread), so that its first message to a peer is the first receive there.
  void begin(const CallStamp& stamp, bool carry);
  void end();    // it succeeded: the stamps sent are waited for, every one received checked
  void abort();  // it failed: stamps in flight are withdrawn (their buffers never reused)
  // Compares stamps with `from` and `to` right now: for a library's own collective, which moves no messages of ours.
  void exchange_with(int from, int to);
  const CallStamp& current() const { return sending_->stamp; }

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
  const CallStamp* call_stamp() const override { return &sending_->stamp; }
  bool peer_gone(int peer) const override { return inner_.peer_gone(peer); }
  void progress() override { inner_.progress(); }
  std::optional<std::vector<int>> ranks_that_gave_up(std::chrono::duration<double> listen) override {
    return inner_.ranks_that_gave_up(listen);
  }
  void abandon() override { inner_.abandon(); }
  void declare_lost(int peer) override { inner_.declare_lost(peer); }
  std::uint64_t sent_to(int peer) const override { return inner_.sent_to(peer); }

  // What leads each run's first message to a peer.
  struct Header {
    CallStamp stamp;
    std::uint64_t bytes = 0;  // the message's, after this header (carried) or on `tag` after it
    std::int32_t tag = 0;     // the message's own
    std::uint32_t flags = 0;  // kHeaderMagic, | kCarried
  };
  static constexpr std::uint32_t kHeaderMagic = 0x68770000u;
  static constexpr std::uint32_t kCarried = 1u;
  static constexpr std::size_t kCarryCallBytes = 4 << 10;  // calls up to this size carry (dispatch.cpp)

 private:
  // A buffer reused run after run, grown when a message needs more.
  struct Staging {
    std::unique_ptr<char[]> bytes;
    std::size_t capacity = 0;
    char* get(std::size_t n);
  };
  // A small call's first receive from a peer: the message lands in `staging`, its bytes then move to `dst`.
  struct Carried {
    Staging staging;
    void* dst = nullptr;
    std::size_t capacity = 0;  // the caller's
    int peer = -1, tag = 0;
  };
  struct Incoming {
    int peer = -1;
    Request req;
    Staging theirs;        // a header, or a small call's whole message (the peer's call differs then)
    bool claimed = false;  // a thread is waiting for it (ring channels share a peer)
    bool checked = false;
  };
  void post_stamp_send(int peer);         // under mu_
  Incoming* post_stamp_recv(int peer);    // under mu_
  void check_before_receiving(int peer);  // waits for the peer's stamp if none has been checked, and checks it
  void check(const Incoming& in);
  void withdraw(std::span<Request> reqs);        // cancels the active ones and leaves them inactive
  void check_header(int peer, const Header& h);  // throws where its stamp differs from this run's, or is none
  Carried* take_carried(const Request& r);       // the staged receive behind r, or null (under mu_)
  void deliver(const Carried& c);                // checks the header that came in c's message and moves its bytes on
  void carried_wait_all(std::span<Request> reqs);

  Transport& inner_;
  std::unique_ptr<Header> sending_;  // the header sent alone (replaced after a failure: sends may still read it)
  std::mutex mu_;
  std::uint64_t epoch_ = 0;                             // runs so far
  std::vector<std::uint64_t> sent_epoch_, recv_epoch_;  // per peer: the run that last stamped it
  std::vector<Incoming*> incoming_of_;                  // per peer: this run's stamp from it
  std::vector<std::unique_ptr<Incoming>> pool_;         // reused run after run; stable addresses for the receives
  std::size_t used_ = 0;
  std::vector<Request> sends_;

  bool carry_ = false;
  std::vector<std::unique_ptr<Carried>> carried_pool_;  // stable addresses
  std::size_t carried_used_ = 0;
  std::vector<std::pair<std::uint64_t, Carried*>> carried_of_;  // this run's, by request handle, until delivered (one
                                                                // per peer: a list, no allocation per call)
  std::vector<std::unique_ptr<Staging>> copies_;                // a small call's first messages as sent
  std::size_t copies_used_ = 0;
};

// One run under a stamp: begin() now, abort() unless finish() was reached.
class StampedRun {
 public:
  StampedRun(StampedTransport* t, const CallStamp& s, bool carry) : t_(t) {
    if (t_) t_->begin(s, carry);
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
