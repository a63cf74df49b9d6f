#include "call_stamps.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/shared_flags.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

std::string call_text(const CallStamp& s) {
  std::string t = fmt::format("{}(count={}, dtype={}", to_string(static_cast<Collective>(s.collective)), s.count,
                              to_string(static_cast<DataType>(s.dtype)));
  return t + ")";
}

CollectiveCheck::Wire wire_of(const CallStamp& s) {
  CollectiveCheck::Wire w;
  w.seq = s.seq;
  w.count = s.count;
  w.codec_hash = s.codec_hash;
  w.collective = s.collective;
  w.dtype = s.dtype;
  w.op = s.op;
  w.root = s.root;
  // The algorithm is left out here: ranks that differ only in it point at the tuner, not at the caller.
  if (s.codec_hash != 0) fmt::format_to_n(w.codec, sizeof w.codec - 1, "#{:08x}", s.codec_hash & 0xffffffffu);
  return w;
}

}  // namespace

CallStamp stamp_of(const CallSignature& call, std::uint64_t seq) {
  const CollectiveCheck::Wire w = CollectiveCheck::to_wire(call, seq);  // drops the fields the collective ignores
  CallStamp s;
  s.seq = seq;
  s.algorithm = w.algorithm;
  s.collective = w.collective;
  s.dtype = w.dtype;
  s.op = w.op;
  s.root = w.root;
  s.count = w.count;
  s.codec_hash = w.codec_hash;
  return s;
}

std::string describe_stamps(const std::vector<CallStamp>& all, const std::vector<int>& ranks) {
  for (std::size_t i = 1; i < all.size(); ++i) {
    const CallStamp &a = all[0], &b = all[i];
    if (a.seq != b.seq || a.part != b.part) {
      const bool b_ahead = b.seq != a.seq ? b.seq > a.seq : b.part > a.part;
      const CallStamp& ahead = b_ahead ? b : a;
      const CallStamp& behind = b_ahead ? a : b;
      const int r_ahead = b_ahead ? ranks[i] : ranks[0], r_behind = b_ahead ? ranks[0] : ranks[i];
      return fmt::format(
          "ranks are at different collective calls (checked by default): rank {} is at call #{} ({}) while rank {} "
          "is at call #{} ({}) on this communicator: a rank skipped a collective call or made an extra one; every "
          "rank must make the same collective calls in the same order",
          r_ahead, ahead.seq, call_text(ahead), r_behind, behind.seq, call_text(behind));
    }
  }
  std::vector<CollectiveCheck::Wire> wires;
  for (const auto& s : all) wires.push_back(wire_of(s));
  std::string why = CollectiveCheck::describe_mismatch(wires, "checked by default", ranks);
  if (!why.empty()) return why + " (HOPWISE_DEBUG=CHECK compares every call before any data moves)";
  for (std::size_t i = 1; i < all.size(); ++i)
    if (all[i].algorithm != all[0].algorithm)
      return fmt::format(
          "internal: the ranks chose different algorithms for the same call #{}: {} on rank {}, {} on rank {}; run "
          "with HOPWISE_TUNE=0 and report this",
          all[0].seq, to_string(static_cast<Algorithm>(all[0].algorithm)), ranks[0],
          to_string(static_cast<Algorithm>(all[i].algorithm)), ranks[i]);
  return {};
}

void throw_stamp_mismatch(Transport& t, const std::string& why) {
  t.abandon();
  throw InvalidArgument(why);
}

namespace {
// Room for what a header's message may hold: a small call's first message (its receives may be smaller, when the
// calls differ) is received whole, so that the stamp names the difference rather than an overflow.
constexpr std::size_t kHeadRoom = sizeof(StampedTransport::Header) + 2 * StampedTransport::kCarryCallBytes;
}  // namespace

StampedTransport::StampedTransport(Transport& inner)
    : inner_(inner),
      sending_(std::make_unique<Header>()),
      sent_epoch_(static_cast<std::size_t>(inner.size()), 0),
      recv_epoch_(static_cast<std::size_t>(inner.size()), 0),
      incoming_of_(static_cast<std::size_t>(inner.size()), nullptr) {}

StampedTransport::~StampedTransport() { abort(); }

char* StampedTransport::Staging::get(std::size_t n) {
  if (n > capacity) {
    bytes.reset(new char[n]);
    capacity = n;
  }
  return bytes.get();
}

void StampedTransport::begin(const CallStamp& stamp, bool carry) {
  std::lock_guard lock(mu_);
  ++epoch_;
  *sending_ = Header{stamp, 0, algo::kTagStamp, kHeaderMagic};
  carry_ = carry;
  sends_.clear();
  used_ = carried_used_ = copies_used_ = 0;
  carried_of_.clear();
  set_timeout(inner_.timeout());
}

void StampedTransport::post_stamp_send(int peer) {
  sends_.push_back(inner_.isend(sending_.get(), sizeof(Header), peer, algo::kTagStamp));
}

StampedTransport::Incoming* StampedTransport::post_stamp_recv(int peer) {
  auto& e = recv_epoch_[static_cast<std::size_t>(peer)];
  Incoming*& in = incoming_of_[static_cast<std::size_t>(peer)];
  if (e == epoch_) return in;
  e = epoch_;
  if (used_ == pool_.size()) pool_.push_back(std::make_unique<Incoming>());
  in = pool_[used_++].get();
  in->peer = peer;
  in->claimed = in->checked = false;
  char* room = in->theirs.get(kHeadRoom);
  std::memset(room, 0, sizeof(Header));
  in->req = inner_.irecv(room, kHeadRoom, peer, algo::kTagStamp);
  return in;
}

Request StampedTransport::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  Staging* copy = nullptr;
  {
    std::lock_guard lock(mu_);
    auto& e = sent_epoch_[static_cast<std::size_t>(peer)];
    if (e == epoch_) return inner_.isend(buf, bytes, peer, tag);
    e = epoch_;
    if (!carry_) {
      post_stamp_send(peer);
      return inner_.isend(buf, bytes, peer, tag);
    }
    if (copies_used_ == copies_.size()) copies_.push_back(std::make_unique<Staging>());
    copy = copies_[copies_used_++].get();
  }
  // A small call: the first message itself, led by the header, on the stamp's tag.
  char* out = copy->get(sizeof(Header) + bytes);
  const Header h{sending_->stamp, bytes, tag, kHeaderMagic | kCarried};
  std::memcpy(out, &h, sizeof h);
  if (bytes != 0) std::memcpy(out + sizeof h, buf, bytes);
  return inner_.isend(out, sizeof h + bytes, peer, algo::kTagStamp);
}

Request StampedTransport::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  Carried* c = nullptr;
  {
    std::lock_guard lock(mu_);
    auto& e = recv_epoch_[static_cast<std::size_t>(peer)];
    if (!carry_) {
      post_stamp_recv(peer);
      return inner_.irecv(buf, bytes, peer, tag);
    }
    if (e == epoch_) return inner_.irecv(buf, bytes, peer, tag);
    e = epoch_;
    if (carried_used_ == carried_pool_.size()) carried_pool_.push_back(std::make_unique<Carried>());
    c = carried_pool_[carried_used_++].get();
  }
  const std::size_t room = std::max(kHeadRoom, sizeof(Header) + bytes);
  char* in = c->staging.get(room);
  std::memset(in, 0, sizeof(Header));
  c->dst = buf;
  c->capacity = bytes;
  c->peer = peer;
  c->tag = tag;
  Request r = inner_.irecv(in, room, peer, algo::kTagStamp);
  if (!r.active) {
    deliver(*c);  // the message was already in (UCX completes such a receive at once): no wait will see it
    return r;
  }
  std::lock_guard lock(mu_);
  carried_of_.emplace_back(r.handle, c);
  return r;
}

void StampedTransport::check_header(int peer, const Header& h) {
  if ((h.flags & ~kCarried) != kHeaderMagic)
    throw_stamp_mismatch(inner_, fmt::format("rank {}'s message on the call stamps' tag carries no stamp (checked by "
                                             "default): HOPWISE_CALL_CHECK must be the same on every rank",
                                             peer));
  // Equal stamps, the case of every call that runs well, cost one comparison; the words only for a difference.
  if (std::memcmp(&sending_->stamp, &h.stamp, sizeof(CallStamp)) == 0) return;
  const std::string why = describe_stamps({sending_->stamp, h.stamp}, {inner_.rank(), peer});
  if (!why.empty()) throw_stamp_mismatch(inner_, why);
}

void StampedTransport::check(const Incoming& in) {
  Header h;
  std::memcpy(&h, in.theirs.bytes.get(), sizeof h);
  check_header(in.peer, h);
  if ((h.flags & kCarried) != 0)
    throw_stamp_mismatch(inner_, fmt::format("internal: rank {} sent call {} as a small call, this rank as a large "
                                             "one; run with HOPWISE_CALL_CHECK=0 and report this",
                                             in.peer, call_text(h.stamp)));
}

void StampedTransport::deliver(const Carried& c) {
  Header h;
  std::memcpy(&h, c.staging.bytes.get(), sizeof h);
  check_header(c.peer, h);
  // The same call on both ranks: its first message here must be the first receive there.
  if ((h.flags & kCarried) == 0 || h.tag != c.tag || h.bytes > c.capacity)
    throw_stamp_mismatch(inner_, fmt::format("internal: call {}'s first message from rank {} has tag {} and {} bytes "
                                             "where this rank receives tag {}, {} bytes first; run with "
                                             "HOPWISE_CALL_CHECK=0 and report this",
                                             call_text(h.stamp), c.peer, h.tag, h.bytes, c.tag, c.capacity));
  if (h.bytes != 0) std::memcpy(c.dst, c.staging.bytes.get() + sizeof h, h.bytes);
}

StampedTransport::Carried* StampedTransport::take_carried(const Request& r) {
  if (!r.active || !r.is_recv) return nullptr;
  for (auto& [handle, c] : carried_of_)
    if (handle == r.handle) {
      Carried* found = c;
      handle = carried_of_.back().first;
      c = carried_of_.back().second;
      carried_of_.pop_back();
      return found;
    }
  return nullptr;
}

void StampedTransport::check_before_receiving(int peer) {
  Incoming* in = nullptr;
  {
    std::lock_guard lock(mu_);
    if (recv_epoch_[static_cast<std::size_t>(peer)] != epoch_) return;
    in = incoming_of_[static_cast<std::size_t>(peer)];
    if (in == nullptr || in->checked || in->claimed) return;  // another channel's thread waits for it
    in->claimed = true;  // from here only this thread touches *in until the run ends
  }
  // The header is posted beside the data and arrives with it: waiting here adds no round trip. (A timeout leaves
  // the request inactive, as for any wait.)
  inner_.wait(in->req);
  std::lock_guard lock(mu_);
  in->checked = true;
  check(*in);
}

// As the transport's own wait does when it gives up: the requests are withdrawn and left inactive, so that a caller
// holding them in a plain array (the barrier) has nothing left to free and no late message lands in its buffer.
void StampedTransport::withdraw(std::span<Request> reqs) {
  for (Request& r : reqs)
    if (r.active) {
      try {
        inner_.cancel(r);
      } catch (const std::exception&) {
      }
      r.active = false;
    }
}

void StampedTransport::carried_wait_all(std::span<Request> reqs) {
  constexpr std::size_t kInline = 16;
  Carried* inline_staged[kInline];
  std::vector<Carried*> many;
  Carried** staged = inline_staged;
  if (reqs.size() > kInline) {
    many.resize(reqs.size());
    staged = many.data();
  }
  {
    // Taken before the wait: once complete, a request's handle may be reused by another receive.
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < reqs.size(); ++i) staged[i] = take_carried(reqs[i]);
  }
  inner_.wait_all(reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i)
    if (staged[i]) deliver(*staged[i]);
}

void StampedTransport::wait_all(std::span<Request> reqs) {
  if (carry_) return carried_wait_all(reqs);
  try {
    int last = -1;
    for (const Request& r : reqs)
      if (r.active && r.is_recv && r.peer != last) {
        check_before_receiving(r.peer);
        last = r.peer;
      }
  } catch (...) {
    withdraw(reqs);  // the stamp's wait timed out, or the stamp differs: the data is not waited for
    throw;
  }
  inner_.wait_all(reqs);
}

bool StampedTransport::test(Request& r) {
  if (carry_) {
    Carried* c = nullptr;
    {
      std::lock_guard lock(mu_);
      c = take_carried(r);
    }
    const bool done = inner_.test(r);
    if (c && !done) {
      std::lock_guard lock(mu_);
      carried_of_.emplace_back(r.handle, c);  // still pending: tested again later
    }
    if (c && done) deliver(*c);
    return done;
  }
  if (r.active && r.is_recv) {
    std::unique_lock lock(mu_);
    if (recv_epoch_[static_cast<std::size_t>(r.peer)] == epoch_) {
      Incoming* in = incoming_of_[static_cast<std::size_t>(r.peer)];
      if (!in->checked && !in->claimed) {
        if (!inner_.test(in->req)) return false;  // the data may be in, but not reported before its stamp is checked
        in->checked = true;
        try {
          check(*in);
        } catch (...) {
          withdraw(std::span<Request>(&r, 1));
          throw;
        }
      }
    }
  }
  return inner_.test(r);
}

void StampedTransport::exchange_with(int from, int to) {
  {
    std::lock_guard lock(mu_);
    auto& e = sent_epoch_[static_cast<std::size_t>(to)];
    if (e != epoch_) {
      e = epoch_;
      post_stamp_send(to);
    }
    post_stamp_recv(from);
  }
  check_before_receiving(from);
}

void StampedTransport::end() {
  // Every peer that sent data here sent its header first; one whose data this run never waited on is checked now.
  for (std::size_t i = 0; i < used_; ++i)
    if (!pool_[i]->checked) check_before_receiving(pool_[i]->peer);
  std::lock_guard lock(mu_);
  inner_.wait_all(sends_);  // small, eager: already gone
  sends_.clear();
  used_ = carried_used_ = copies_used_ = 0;  // the caller waited for its sends: the copies are free again
}

void StampedTransport::abort() {
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < used_; ++i)
    if (pool_[i]->req.active) {
      try {
        inner_.cancel(pool_[i]->req);  // a cancelled receive never writes later: the entry may be reused
      } catch (const std::exception&) {
      }
    }
  bool in_flight = false;
  for (Request& r : sends_)
    if (r.active) {
      in_flight = true;
      try {
        inner_.cancel(r);
      } catch (const std::exception&) {
      }
    }
  // A withdrawn send may still read its buffer: leave that one to it and send later headers from a new one.
  if (in_flight) {
    auto next = std::make_unique<Header>(*sending_);
    (void)sending_.release();
    sending_ = std::move(next);
  }
  // The same for a small call's first messages (their sends were the caller's to wait for or withdraw).
  for (std::size_t i = 0; i < copies_used_; ++i) (void)copies_[i]->bytes.release();
  copies_.erase(copies_.begin(), copies_.begin() + static_cast<std::ptrdiff_t>(copies_used_));
  sends_.clear();
  used_ = carried_used_ = copies_used_ = 0;
  carried_of_.clear();
}

void algo::throw_slot_stamps_differ(Transport& t, SharedSlots& sh, std::uint64_t seq) {
  std::vector<CallStamp> all{*t.call_stamp()};
  std::vector<int> ranks{t.rank()};
  for (int r = 0; r < t.size(); ++r)
    if (r != t.rank()) {
      all.push_back(*stamp_place(sh.base[static_cast<std::size_t>(r)], seq));
      ranks.push_back(r);
    }
  std::string why = describe_stamps(all, ranks);
  if (why.empty()) why = "internal: the ranks' call stamps in shared memory differ in no field";
  throw_stamp_mismatch(t, why);
}

}  // namespace hopwise::comm
