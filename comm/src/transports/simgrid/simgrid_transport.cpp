// The transport of simulated ranks (hopwise/comm/transports/simgrid_transport.h): each message a SimGrid communication
// of its true size on the mailbox of its (sender, receiver, tag slot), so messages of one pair and tag keep their
// order, as MPI's do. Tags share a slot kTagSlots apart: SimGrid never frees a mailbox, and a ring's tag per step gave
// 4096 ranks 33.5 M of them (a 512-rank ring's call took 503 MB with a mailbox per tag, 361 with slots). A message
// carries its tag, and one that meets a receive posted for another tag of its slot is an error, never a mix-up. A send
// copies its bytes at once (the caller may reuse its buffer); the receiver copies them out when the transfer completes.
// Waits are SimGrid's: they take simulated time and give the engine to the other actors.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <simgrid/Exception.hpp>
#include <simgrid/s4u.hpp>
#include <unordered_map>
#include <unordered_set>

#include "actor_side_by_side.h"
#include "hopwise/comm/transports/simgrid_transport.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/topology/cluster.h"

namespace hopwise::comm::sim {

namespace s4u = simgrid::s4u;

namespace {

struct Message;

// One sender's stream to one receiver, as a TCP connection carries it: its messages flow one after another, in the
// order sent. (As separate flows, a rank's sends shared its link evenly, so every one of them, chunk 0 too, ended
// only when all had: a pipelined tree waited at each level for the whole level above.) A daemon actor of the
// sender's host pumps the queue; the sender's request is done at once, as a send into a socket buffer is.
struct Connection {
  struct Queued {
    s4u::Mailbox* box;
    Message* message;
    std::size_t bytes;
  };
  std::deque<Queued> queue;  // one OS thread runs every actor, switching only inside SimGrid's calls: no lock
  s4u::SemaphorePtr ready = s4u::Semaphore::create(0);
};

struct Job {
  std::uint64_t id = 0;
  std::vector<std::string> hosts;  // rank -> host name
  std::vector<int> host_ids;       // rank -> host index (hosts counted from 0 in rank order)
  std::vector<int> local_ranks, local_sizes;
  RunOptions options;
  std::vector<s4u::ActorPtr> actors;            // rank -> its actor, the permanent receiver of its mailboxes
  std::unordered_set<s4u::Mailbox*> mailboxes;  // those given a receiver, cleared at the end
  std::unordered_set<Message*> live;            // messages not yet freed (one left in a mailbox is freed at the end)
  std::size_t held = 0;  // bytes in messages not yet delivered (one OS thread runs every actor: no lock)
  std::map<std::pair<int, int>, std::shared_ptr<Connection>> connections;  // (sender, receiver), eager runs only
};

// What travels: the bytes (when the run carries them) and the true size, for the receiver's overflow check. The
// job keeps count of its messages and of the bytes they hold.
struct Message {
  std::vector<char> bytes;
  std::size_t size = 0;
  int tag = 0;
  Job* job = nullptr;
  Message(std::size_t n, int t, Job* j) : size(n), tag(t), job(j) { job->live.insert(this); }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  ~Message() {
    job->held -= bytes.size();
    job->live.erase(this);
  }
};

// One pending send or receive of a rank.
struct Pending {
  s4u::CommPtr comm;
  bool is_recv = false;
  int peer = 0, tag = 0;
  Message* sent = nullptr;  // a send's message, the sender's until its transfer completes
  Message* got = nullptr;   // a receive's message, set by SimGrid when the transfer completes
  void* buf = nullptr;      // a receive's buffer and its size
  std::size_t capacity = 0;
};

s4u::Engine& engine() {
  static s4u::Engine* e = [] {
    static int argc = 2;
    static char name[] = "hopwise-sim", quiet[] = "--log=root.thres:warning";
    static char* argv[] = {name, quiet, nullptr};
    return new s4u::Engine(&argc, argv);  // SimGrid keeps one engine per process, to its end
  }();
  return *e;
}

// The run in progress (one at a time: engine().run() returns when it ends), for the element-wise work's hook.
Job* running_job = nullptr;

// reduce_into, scale_by and copy_bytes on the simulation's thread: their time charged to the rank's actor, the
// work skipped where the buffers hold nothing.
bool charge_element_work(ElementWork work, std::size_t bytes) {
  if (running_job == nullptr || s4u::Actor::self() == nullptr) return false;
  const RunOptions& o = running_job->options;
  const double rate = work == ElementWork::kReduce ? o.reduce_bytes_per_s : o.copy_bytes_per_s;
  if (rate > 0) s4u::this_actor::sleep_for(static_cast<double>(bytes) / rate);
  return !o.real_payloads;
}

std::string& loaded_platform() {
  static std::string path;
  return path;
}

class SimgridTransport final : public Transport {
 public:
  SimgridTransport(std::shared_ptr<Job> job, int rank) : job_(std::move(job)), rank_(rank) {
    timeout_ = std::chrono::duration<double>(job_->options.timeout_s);
  }
  ~SimgridTransport() override {
    for (auto& [handle, p] : pending_) drop(*p);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(job_->hosts.size()); }
  std::string name() const override { return "simgrid"; }
  int local_rank() const override { return job_->local_ranks[static_cast<std::size_t>(rank_)]; }
  int local_size() const override { return job_->local_sizes[static_cast<std::size_t>(rank_)]; }
  int host_id() const override { return job_->host_ids[static_cast<std::size_t>(rank_)]; }

  Request isend(const void* buf, std::size_t bytes, int peer, int tag) override {
    check_peer("isend to", peer);
    count_sent(peer, bytes);
    auto p = std::make_unique<Pending>();
    p->peer = peer;
    p->tag = tag;
    if (job_->options.real_payloads && job_->held + bytes > job_->options.max_held_bytes)
      throw InvalidArgument(fmt::format(
          "simulation: rank {}'s send of {} bytes to rank {} would make the messages in flight hold more than {} "
          "bytes (RunOptions::max_held_bytes; every message's bytes are copied): fewer ranks or smaller calls",
          rank_, bytes, peer, job_->options.max_held_bytes));
    p->sent = new Message(bytes, tag, job_.get());
    if (job_->options.real_payloads && bytes > 0) {
      p->sent->bytes.assign(static_cast<const char*>(buf), static_cast<const char*>(buf) + bytes);
      job_->held += bytes;
    }
    s4u::Mailbox* box = mailbox(rank_, peer, tag);
    if (!job_->options.eager) {
      p->comm = box->put_async(p->sent, bytes);
      return keep(std::move(p), peer, false);
    }
    // Its bytes flow before the receive is posted. (Our own record: SimGrid 3.32's get_receiver() fails on a
    // mailbox without one.)
    if (job_->mailboxes.insert(box).second) box->set_receiver(job_->actors[static_cast<std::size_t>(peer)]);
    Connection& c = connection(peer);
    c.queue.push_back({box, p->sent, bytes});
    c.ready->release();
    p->sent = nullptr;  // the connection's now, then the receiver's
    return keep(std::move(p), peer, false);
  }

  Request irecv(void* buf, std::size_t bytes, int peer, int tag) override {
    check_peer("irecv from", peer);
    auto p = std::make_unique<Pending>();
    p->is_recv = true;
    p->peer = peer;
    p->tag = tag;
    p->buf = buf;
    p->capacity = bytes;
    p->comm = mailbox(peer, rank_, tag)->get_async<Message>(&p->got);
    return keep(std::move(p), peer, true);
  }

  void wait_all(std::span<Request> reqs) override {
    const double deadline = s4u::Engine::get_clock() + timeout_.count();
    std::string error;
    std::vector<int> failed;
    for (Request& r : reqs) {
      if (!r.active) continue;
      Pending& p = *pending_.at(r.handle);
      if (!p.comm) {  // a send handed to its connection
        finish(r);
        continue;
      }
      try {
        const double left = std::max(0.0, deadline - s4u::Engine::get_clock());
        // wait_any_for, not wait_for: a comm that times out stays valid, to be cancelled below.
        if (s4u::Comm::wait_any_for({p.comm}, left) < 0) timed_out(reqs);
      } catch (const simgrid::Exception& e) {
        failed.push_back(r.peer);
        if (error.empty())
          error = fmt::format(
              "rank {}: the transfer with rank {} failed ({}); that rank's actor ended or its link "
              "failed",
              rank_, r.peer, e.what());
        cancel(r);
        continue;
      }
      if (const std::string overflow = finish(r); !overflow.empty() && error.empty()) error = overflow;
    }
    if (!error.empty()) {
      for (Request& r : reqs) cancel(r);
      std::sort(failed.begin(), failed.end());
      failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
      throw TransportError(error, failed);
    }
  }

  bool test(Request& r) override {
    if (!r.active) return true;
    Pending& p = *pending_.at(r.handle);
    bool done = !p.comm;  // a send handed to its connection
    try {
      if (!done) done = p.comm->test();
    } catch (const simgrid::Exception& e) {
      const int peer = r.peer;
      cancel(r);
      throw TransportError(fmt::format("rank {}: the transfer with rank {} failed ({})", rank_, peer, e.what()),
                           {peer});
    }
    if (!done) return false;
    if (const std::string overflow = finish(r); !overflow.empty()) throw TransportError(overflow);
    return true;
  }

  void cancel(Request& r) override {
    if (!r.active) return;
    const auto it = pending_.find(r.handle);
    if (it != pending_.end()) {
      drop(*it->second);
      pending_.erase(it);
    }
    r.active = false;
  }

 private:
  void check_peer(const char* what, int peer) const {
    if (peer < 0 || peer >= size()) throw InvalidArgument(fmt::format("{} rank {} of {}", what, peer, size()));
  }

  static constexpr int kTagSlots = 64;
  s4u::Mailbox* mailbox(int from, int to, int tag) const {
    return s4u::Mailbox::by_name(
        fmt::format("{}:{}>{}#{}", job_->id, from, to, (tag % kTagSlots + kTagSlots) % kTagSlots));
  }

  // This rank's connection to `peer`, its pump started at the first send.
  Connection& connection(int peer) {
    auto& c = job_->connections[{rank_, peer}];
    if (!c) {
      c = std::make_shared<Connection>();
      s4u::ActorPtr pump = s4u::Actor::create(fmt::format("rank{}>{}", rank_, peer), s4u::this_actor::get_host(), [c] {
        // Two messages in flight at most: the next one's latency passes while the last one's bytes flow.
        std::deque<s4u::CommPtr> flying;
        for (;;) {
          if (flying.size() < 2 && !c->queue.empty()) {
            c->ready->acquire();  // counts the queue: does not block here
            const Connection::Queued m = c->queue.front();
            c->queue.pop_front();
            flying.push_back(m.box->put_async(m.message, m.bytes));
            continue;
          }
          if (flying.empty()) {  // nothing to send: sleep until a send is queued
            c->ready->acquire();
            c->ready->release();
            continue;
          }
          try {
            flying.front()->wait();
          } catch (const simgrid::Exception&) {  // the receiver's actor ended: the run's end frees the message
          }
          flying.pop_front();
        }
      });
      pump->daemonize();  // ends with the run's last rank
    }
    return *c;
  }

  Request keep(std::unique_ptr<Pending> p, int peer, bool is_recv) {
    const std::uint64_t handle = next_handle_++;
    pending_.emplace(handle, std::move(p));
    return Request{handle, peer, is_recv, true};
  }

  // A completed request: a receive's bytes into its buffer (an overflow's text instead), the message freed.
  std::string finish(Request& r) {
    auto node = pending_.extract(r.handle);
    r.active = false;
    Pending& p = *node.mapped();
    std::string error;
    if (!p.is_recv) {
      p.sent = nullptr;  // delivered: the receiver frees it
    } else if (p.got != nullptr) {
      if (p.got->tag != p.tag)
        error = fmt::format(
            "rank {}: a message of tag {} from rank {} met the receive posted for tag {} (the simulation's mailboxes "
            "hold tags {} apart in one queue, and this algorithm receives them out of the order they were sent)",
            rank_, p.got->tag, p.peer, p.tag, kTagSlots);
      else if (p.got->size > p.capacity)
        error = fmt::format(
            "rank {}: a message of {} bytes from rank {} (tag {}) overflows the {}-byte receive posted "
            "for it; post receives at least as large as the sends",
            rank_, p.got->size, p.peer, p.tag, p.capacity);
      else if (!p.got->bytes.empty())
        std::memcpy(p.buf, p.got->bytes.data(), p.got->size);
      delete p.got;
      p.got = nullptr;
    }
    return error;
  }

  // Withdraws a request that will not complete here; a send's message that never left is freed.
  static void drop(Pending& p) {
    try {
      if (p.comm && p.comm->get_state() != s4u::Activity::State::FINISHED) p.comm->cancel();
    } catch (const simgrid::Exception&) {
    }
    if (p.comm && p.comm->get_state() == s4u::Activity::State::FINISHED) {
      p.sent = nullptr;  // delivered after all: the receiver frees it
    }
    delete p.sent;
    delete p.got;
    p.sent = p.got = nullptr;
  }

  [[noreturn]] void timed_out(std::span<Request> reqs) {
    std::vector<int> peers;
    for (Request& r : reqs)
      if (r.active) {
        peers.push_back(r.peer);
        cancel(r);
      }
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    throw TimeoutError(fmt::format("rank {} timed out after {:.1f} simulated s waiting for rank(s) {}; a peer ended, "
                                   "stalled or skipped this call",
                                   rank_, timeout_.count(), fmt::join(peers, ",")),
                       peers);
  }

  std::shared_ptr<Job> job_;
  int rank_ = 0;
  std::uint64_t next_handle_ = 1;
  std::unordered_map<std::uint64_t, std::unique_ptr<Pending>> pending_;
};

}  // namespace

void configure(const std::string& name_colon_value) {
  engine();
  if (!loaded_platform().empty())
    throw InvalidArgument(
        fmt::format("SimGrid option {}: give options before the platform is loaded", name_colon_value));
  const auto colon = name_colon_value.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == name_colon_value.size())
    throw InvalidArgument(
        fmt::format("SimGrid option '{}': write NAME:VALUE, e.g. network/latency-factor:1", name_colon_value));
  try {
    s4u::Engine::set_config(name_colon_value);
  } catch (const std::exception& e) {
    const std::string why = e.what();  // SimGrid lists every key after the first line
    throw InvalidArgument(fmt::format("SimGrid refused the option '{}': {} (SimGrid's documentation lists its options)",
                                      name_colon_value, why.substr(0, why.find('\n'))));
  }
}

void load_platform(const std::string& xml_path) {
  std::string& loaded = loaded_platform();
  if (loaded == xml_path) return;
  if (!loaded.empty())
    throw InvalidArgument(
        fmt::format("SimGrid holds one platform per process: {} is loaded, so {} cannot be; run "
                    "another process for it",
                    loaded, xml_path));
  try {
    engine().load_platform(xml_path);
  } catch (const std::exception& e) {
    throw InvalidArgument(fmt::format("SimGrid could not load the platform {}: {}", xml_path, e.what()));
  }
  loaded = xml_path;
}

std::vector<std::string> host_names() {
  std::vector<std::string> names;
  for (const s4u::Host* h : engine().get_all_hosts()) names.push_back(h->get_name());
  // SimGrid lists them in no useful order: a cluster's hosts in its radical's order (n2 before n10), so that a fat
  // tree's leaves hold consecutive hosts, as the planner orders hosts.
  std::stable_sort(names.begin(), names.end(), topology::host_name_less);
  return names;
}

double now() { return s4u::Engine::get_clock(); }

void sleep_for(double seconds) { s4u::this_actor::sleep_for(seconds); }

double run_ranks(const std::vector<std::string>& hosts, const std::function<void(int, Transport&)>& body,
                 const RunOptions& options) {
  if (loaded_platform().empty()) throw InvalidArgument("sim::run_ranks: load a platform first (sim::load_platform)");
  if (hosts.empty()) throw InvalidArgument("sim::run_ranks: give at least one rank");
  if (!(options.reduce_bytes_per_s >= 0) || !(options.copy_bytes_per_s >= 0))
    throw InvalidArgument(
        fmt::format("sim::run_ranks: element-wise rates must be >= 0 bytes/s (0: no time); got {} and {}",
                    options.reduce_bytes_per_s, options.copy_bytes_per_s));
  static std::uint64_t next_job = 1;
  auto job = std::make_shared<Job>();
  job->id = next_job++;
  job->hosts = hosts;
  job->options = options;
  std::map<std::string, int> host_index, on_host;
  for (const std::string& h : hosts) {
    if (engine().host_by_name_or_null(h) == nullptr)
      throw InvalidArgument(fmt::format("sim::run_ranks: the platform has no host named '{}'", h));
    const auto [it, added] = host_index.emplace(h, static_cast<int>(host_index.size()));
    job->host_ids.push_back(it->second);
    job->local_ranks.push_back(on_host[h]++);
  }
  for (const std::string& h : hosts) job->local_sizes.push_back(on_host[h]);

  const int n = static_cast<int>(hosts.size());
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<double> failed_at(static_cast<std::size_t>(n), 0.0);
  const double start = now();
  double last = start;
  for (int r = 0; r < n; ++r)
    job->actors.push_back(
        s4u::Actor::create(fmt::format("rank{}", r), engine().host_by_name(hosts[static_cast<std::size_t>(r)]), [&, r] {
          try {
            SimgridTransport t(job, r);
            body(r, t);
          } catch (...) {  // never out of an actor: SimGrid would end the process
            errors[static_cast<std::size_t>(r)] = std::current_exception();
            failed_at[static_cast<std::size_t>(r)] = now();
          }
          last = std::max(last, now());
        }));
  // Once every rank has returned, an actor of its own (SimGrid's calls belong inside actors) takes the receivers
  // off the run's mailboxes and drops the sends nobody took.
  s4u::Actor::create("cleanup", engine().host_by_name(hosts[0]), [job] {
    for (const s4u::ActorPtr& a : job->actors) a->join();
    for (s4u::Mailbox* box : job->mailboxes) {
      box->set_receiver(nullptr);
      box->clear();
    }
  });
  {
    struct Charging {  // the element-wise work's hook and the parts' actors, for this run only
      explicit Charging(Job* j) {
        running_job = j;
        set_work_hook(charge_element_work);
        algo::set_side_by_side(&actors_side_by_side());
      }
      ~Charging() {
        algo::set_side_by_side(nullptr);
        set_work_hook(nullptr);
        running_job = nullptr;
      }
    } charging(job.get());
    engine().run();
  }
  job->actors.clear();
  for (Message* m : std::vector<Message*>(job->live.begin(), job->live.end())) delete m;
  // The first failure in simulated time is the cause; the others' timeouts follow from it.
  int first = -1;
  for (int r = 0; r < n; ++r)
    if (errors[static_cast<std::size_t>(r)] &&
        (first < 0 || failed_at[static_cast<std::size_t>(r)] < failed_at[static_cast<std::size_t>(first)]))
      first = r;
  if (first >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(first)]);
  return last - start;
}

std::vector<Algorithm> sim_algorithms() {
  std::vector<Algorithm> out;
  for (Algorithm a : all_algorithms()) {
    const AlgorithmInfo& row = algorithm_info(a);
    if (row.needs_native || a == Algorithm::kTwoShot) continue;
    out.push_back(a);
  }
  return out;
}

}  // namespace hopwise::comm::sim
