// Elastic membership: when a peer is lost, the survivors agree through the job's store on who is left and carry on
// over a new communicator, without a restart (HOPWISE_ELASTIC=shrink). Each membership is a generation; generation 0
// is the job as launched. The trainer keeps the state each step started from and redoes the step that failed
// (train_mnist does; see the README's "When a rank dies").
//
// How the survivors agree (generation g, its members M): while it is a member, each process's heartbeat bumps a counter
// of its own in the store every heartbeat_period() (settle_s / 4). Each survivor that gave up on a collective marks
// itself alive for g and waits until every member of M has, or every member still missing is lost: its counter stood
// still for `settle_s` (killed, or stopped: a stopped process's heartbeat stops too). A missing member whose counter
// moves is alive, only slow (a loaded machine, a longer step): it gives up on its own collective within the
// communicator's timeout, so it is waited for up to that timeout past settle_s. The first to finish its wait writes the
// members of g+1 (those marked alive then), which every survivor reads: all hold the same list. A member that marks
// itself later reads a list without itself and is refused, naming the generation, so that it cannot re-enter with a
// stale model. The store must outlive every rank that may die: a TCP store served by rank 0 dies with it
// (HOPWISE_STORE=file:///shared/dir does not).
//
// Growing (HOPWISE_ELASTIC=grow): a process started later (HOPWISE_ELASTIC_JOIN=1) takes a ticket in the store and
// waits. At each step boundary the members call admit(): they agree (an allreduce of the smallest ticket count each
// saw) on the tickets to let in, rank 0 writes the next generation's members, and all, the newcomers included, meet
// over its transport; the trainer then sends the newcomers its state.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/store.h"
#include "hopwise/comm/transport.h"

namespace hopwise::comm {

struct ElasticOptions {
  bool shrink = false;  // carry on over the survivors when a peer is lost
  bool grow = false;    // let processes started later join at a step boundary (admit())
  bool join = false;    // this process is one (HOPWISE_ELASTIC_JOIN=1)
  double settle_s = 3;  // how long a missing member's heartbeat must stand still before the survivors leave it out
  // A member's heartbeat beats four times a window: one late beat does not look like silence.
  Store::Seconds heartbeat_period() const { return Store::Seconds(settle_s / 4); }
  int min_ranks = 1;  // fewer survivors than this: the job fails (and a launcher may restart it)
  // Where the ranks' models differ (an averaging method): every this many steps each rank's state goes to its ring
  // successor (NeighbourCopy). 1 keeps the last step's; N costs 1/N as much and risks N-1 steps of a lost rank's
  // progress since its copy.
  std::int64_t copy_every = 1;
  // Under grow, newcomers_waiting(step) asks (a store read and an 8-byte allreduce: up to 2.7 ms of a 14 ms step
  // on 4 ranks here) only at steps that are multiples of this: a newcomer waits up to this many steps longer.
  std::int64_t grow_every = 10;
  // "off", "shrink", "grow" or "shrink,grow"; settle, min_ranks, copy_every and grow_every from
  // HOPWISE_ELASTIC_SETTLE_S, HOPWISE_ELASTIC_MIN_RANKS, HOPWISE_ELASTIC_COPY_EVERY and HOPWISE_ELASTIC_GROW_EVERY,
  // join from HOPWISE_ELASTIC_JOIN. InvalidArgument naming what is wrong.
  static ElasticOptions parse(const std::string& mode);
  static ElasticOptions from_env();  // HOPWISE_ELASTIC (default off)
};

// One change of membership, as every member of the new generation sees it.
struct ElasticEvent {
  std::int64_t generation = 0;   // the new one
  std::vector<int> left;         // member ids that are gone (ranks of generation 0; newcomers number on from the size)
  std::vector<int> joined;       // member ids that came in
  std::vector<int> not_arrived;  // newcomers let in that never came (died after taking their ticket): timed out
  std::vector<int> members;      // the new generation's, in rank order
  double stood_still_s = 0;      // from this rank giving up to the new communicator being ready
  std::string describe() const;  // "generation 1: rank(s) 2 left; 3 ranks go on (0, 1, 3) after 2.4 s"
};

// The agreement alone (what shrink() does before it rebuilds), for a framework that builds its own group over the
// survivors (hopwise.torch's ElasticContext, which keeps an ElasticHeartbeat): member `id` of `members` (generation
// `generation`) gave up; returns the next generation's members, the same on every survivor. A missing member that
// still beats is waited for up to `timeout` past settle_s. Error as shrink() names it (left out, nothing lost, fewer
// than min_ranks, the store gone), `why` appended.
std::vector<int> agree_on_survivors(Store& store, std::int64_t generation, int id, const std::vector<int>& members,
                                    const ElasticOptions& options, Store::Seconds timeout, const std::string& why);

// A member's sign of life while it belongs to an elastic job: a thread sets elastic_beat_key(id) to a counter that
// grows every `period` (ElasticGroup keeps one from its first generation on). A store that fails stops it, with a
// warning. The store must take calls from two threads at once (every hopwise store does; a TCP store's client
// queues them).
class ElasticHeartbeat {
 public:
  ElasticHeartbeat(std::shared_ptr<Store> store, int id, Store::Seconds period);
  ~ElasticHeartbeat();  // stops beating (a member that leaves looks lost after settle_s)
  ElasticHeartbeat(const ElasticHeartbeat&) = delete;
  ElasticHeartbeat& operator=(const ElasticHeartbeat&) = delete;

 private:
  struct State;
  std::unique_ptr<State> s_;
};
std::string elastic_beat_key(int id);  // "hopwise/elastic/beat/ID"

class ElasticGroup {
 public:
  // The transport of a generation: its members meet through `store` under `key`.
  using TransportFactory = std::function<std::unique_ptr<Transport>(std::shared_ptr<Store> store, int rank, int size,
                                                                    const std::string& key, Store::Seconds timeout)>;
  // Generation 0: this process is member `id` of `size` (its launch rank). Collective. Default transport: UCX.
  ElasticGroup(std::shared_ptr<Store> store, int id, int size, ElasticOptions options, Options comm_options,
               TransportFactory transport = {});
  // A newcomer: takes a ticket in `store` and waits (up to the communicator's timeout, TimeoutError) until the
  // members admit it.
  static std::unique_ptr<ElasticGroup> join(std::shared_ptr<Store> store, ElasticOptions options, Options comm_options,
                                            TransportFactory transport = {});
  // Over the job as launched (launch.h): its store and rank, or join() where options.join; InvalidArgument where the
  // launch has no store (under mpirun: set HOPWISE_TRANSPORT=ucx; MPI cannot shrink a world communicator).
  // Collective.
  static std::unique_ptr<ElasticGroup> from_launch(ElasticOptions options, Options comm_options = Options::from_env());
  ~ElasticGroup();

  Communicator& comm() { return *comm_; }
  int id() const { return id_; }
  std::int64_t generation() const { return generation_; }
  const std::vector<int>& members() const { return members_; }
  const ElasticOptions& options() const { return options_; }

  // After a collective failed on this rank: agree with the other survivors on who is left and rebuild comm() over
  // them (references to the old communicator are void). Error naming the generation when this rank was left out
  // (it answered after the survivors agreed), when fewer than min_ranks are left, or when the store is gone.
  ElasticEvent shrink(const std::string& why);
  // At a step boundary, on every member (collective over comm()): whether newcomers wait, as all members agree.
  bool newcomers_waiting();
  // The same at step `step` (alike on every member), asking only where step is a multiple of grow_every.
  bool newcomers_waiting(std::int64_t step);
  // Then, on every member: lets them in and rebuilds comm() over the grown generation (references to the old
  // communicator are void; the newcomers' join() returns once all have met). A newcomer that never comes (it died
  // after taking its ticket) is timed out: the members agree on who is here, as after a lost rank, and go on
  // without it (the event's not_arrived). Error only where a member was lost too and shrink is off.
  ElasticEvent admit();
  bool joined_late() const { return joined_late_; }  // this process came in through join()

 private:
  ElasticGroup(std::shared_ptr<Store> store, ElasticOptions options, Options comm_options, TransportFactory transport);
  void build(std::int64_t generation, std::vector<int> members);

  std::shared_ptr<Store> store_;
  int id_;
  ElasticOptions options_;
  Options comm_options_;
  TransportFactory transport_;
  std::int64_t generation_ = 0;
  std::vector<int> members_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<ElasticHeartbeat> heartbeat_;  // under shrink, from the first generation this member is in
  std::int64_t admitted_ = 0;                    // tickets let in so far, alike on every member
  std::int64_t waiting_ = 0;                     // tickets seen by every member at the last newcomers_waiting()
  std::int64_t refused_tickets_ = -1;            // a ticket count refused as implausible (warned about once)
  bool ticket_count_unreadable_ = false;         // the store's ticket count failed to read (warned about once)
  std::int64_t next_id_ = 0;                     // the id the next newcomer gets: ids are never reused
  bool joined_late_ = false;
};

}  // namespace hopwise::comm
