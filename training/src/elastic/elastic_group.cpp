// Elastic membership (elastic.h): generations of members agreed through the store, each over a transport of its own.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "elastic_values.h"
#include "hopwise/comm/launch.h"
#include "hopwise/comm/transports/ucx_transport.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "hopwise/training/elastic.h"

namespace hopwise::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string key(std::int64_t generation, const std::string& what) {
  return fmt::format("hopwise/elastic/{}/{}", generation, what);
}

using namespace elastic_values;

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

ElasticGroup::TransportFactory ucx_factory() {
  return [](std::shared_ptr<Store> store, int rank, int size, const std::string& name, Store::Seconds timeout) {
    return std::make_unique<UcxTransport>(std::move(store), rank, size, name, timeout);
  };
}

}  // namespace

ElasticOptions ElasticOptions::parse(const std::string& mode) {
  ElasticOptions o;
  std::size_t at = 0;
  while (mode != "off" && at < mode.size()) {
    const std::size_t comma = std::min(mode.find(',', at), mode.size());
    const std::string word = mode.substr(at, comma - at);
    if (word == "shrink")
      o.shrink = true;
    else if (word == "grow")
      o.grow = true;
    else
      throw InvalidArgument(fmt::format(
          "HOPWISE_ELASTIC={}: '{}' is not a mode; use shrink (the survivors of a lost rank carry on), grow "
          "(processes started later join), shrink,grow, or off (a lost rank fails the job; a launcher that restarts "
          "it resumes from a checkpoint)",
          mode, word));
    at = comma + 1;
  }
  o.join = env::get_or("HOPWISE_ELASTIC_JOIN", "0") == "1";
  if (o.join && !o.grow)
    throw InvalidArgument(
        "HOPWISE_ELASTIC_JOIN=1 joins a running job, which must let newcomers in: "
        "HOPWISE_ELASTIC=grow (or shrink,grow) on every process");
  o.settle_s = env::get_double("HOPWISE_ELASTIC_SETTLE_S", o.settle_s);
  if (!(o.settle_s > 0 && o.settle_s < 3600))
    throw InvalidArgument(fmt::format("HOPWISE_ELASTIC_SETTLE_S={}: give seconds above 0 (default 3)", o.settle_s));
  o.min_ranks = static_cast<int>(env::get_int("HOPWISE_ELASTIC_MIN_RANKS", o.min_ranks));
  if (o.min_ranks < 1)
    throw InvalidArgument(fmt::format("HOPWISE_ELASTIC_MIN_RANKS={}: give a rank count of 1 or more", o.min_ranks));
  o.copy_every = env::get_int("HOPWISE_ELASTIC_COPY_EVERY", o.copy_every);
  if (o.copy_every < 1)
    throw InvalidArgument(
        fmt::format("HOPWISE_ELASTIC_COPY_EVERY={}: give a step count of 1 or more (1, the default: a copy every step)",
                    o.copy_every));
  o.grow_every = env::get_int("HOPWISE_ELASTIC_GROW_EVERY", o.grow_every);
  if (o.grow_every < 1)
    throw InvalidArgument(fmt::format(
        "HOPWISE_ELASTIC_GROW_EVERY={}: give a step count of 1 or more (10, the default: newcomers are looked for "
        "every 10 steps)",
        o.grow_every));
  return o;
}

ElasticOptions ElasticOptions::from_env() { return parse(env::get_or("HOPWISE_ELASTIC", "off")); }

std::string ElasticEvent::describe() const {
  std::vector<std::string> what;
  if (!left.empty()) what.push_back(fmt::format("rank(s) {} left", fmt::join(left, ", ")));
  if (!joined.empty()) what.push_back(fmt::format("rank(s) {} joined", fmt::join(joined, ", ")));
  if (!not_arrived.empty())
    what.push_back(fmt::format("newcomer(s) {} let in but never arrived (timed out)", fmt::join(not_arrived, ", ")));
  return fmt::format("generation {}: {}; {} rank(s) go on ({}) after {:.1f} s", generation, fmt::join(what, "; "),
                     members.size(), fmt::join(members, ", "), stood_still_s);
}

ElasticGroup::ElasticGroup(std::shared_ptr<Store> store, int id, int size, ElasticOptions options, Options comm_options,
                           TransportFactory transport)
    : store_(std::move(store)),
      id_(id),
      options_(options),
      comm_options_(std::move(comm_options)),
      transport_(transport ? std::move(transport) : ucx_factory()) {
  if (size < 1 || id < 0 || id >= size)
    throw InvalidArgument(fmt::format("ElasticGroup: member {} of {} does not exist", id, size));
  std::vector<int> all(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) all[static_cast<std::size_t>(r)] = r;
  next_id_ = size;  // newcomers number on from the launched ranks
  build(0, std::move(all));
}

ElasticGroup::ElasticGroup(std::shared_ptr<Store> store, ElasticOptions options, Options comm_options,
                           TransportFactory transport)
    : store_(std::move(store)),
      id_(-1),
      options_(options),
      comm_options_(std::move(comm_options)),
      transport_(transport ? std::move(transport) : ucx_factory()),
      joined_late_(true) {}

ElasticGroup::~ElasticGroup() = default;

std::unique_ptr<ElasticGroup> ElasticGroup::join(std::shared_ptr<Store> store, ElasticOptions options,
                                                 Options comm_options, TransportFactory transport) {
  std::unique_ptr<ElasticGroup> g(
      new ElasticGroup(std::move(store), options, std::move(comm_options), std::move(transport)));
  const Store::Seconds timeout(g->comm_options_.timeout_s);
  Store& s = *g->store_;
  const std::int64_t ticket = s.add("hopwise/elastic/tickets", 1);
  try {
    if (ticket < 1 || ticket > kLargestCount)
      throw Error(
          fmt::format("elastic: the store's ticket count gave this process ticket {}, which no job hands out "
                      "(a damaged store, or another job's keys in it?)",
                      ticket));
    const Admission a = parse_admission(s.get(fmt::format("hopwise/elastic/admitted/{}", ticket), timeout), ticket);
    std::vector<int> members = parse_member_list(s.get(key(a.generation, "members"), timeout));
    if (!contains(members, static_cast<int>(a.id)))
      throw Error(
          fmt::format("elastic: ticket {} was let in as member {} of generation {}, but its member list ({}) "
                      "lacks that id (a damaged store?)",
                      ticket, a.id, a.generation, member_list_text(members).substr(0, 200)));
    g->id_ = static_cast<int>(a.id);
    g->admitted_ = a.admitted;
    g->next_id_ = a.next_id;
    g->build(a.generation, std::move(members));
  } catch (const TimeoutError& e) {
    throw TimeoutError(
        fmt::format("elastic: this process (ticket {}) was not let in within {:.0f} s: is the job running with "
                    "HOPWISE_ELASTIC=grow, and reaching step boundaries? ({})",
                    ticket, g->comm_options_.timeout_s, e.what()),
        {});
  }
  return g;
}

bool ElasticGroup::newcomers_waiting() {
  if (!options_.grow) return false;
  // Every member must let in the same tickets: the fewest any of them saw.
  try {
    waiting_ = store_->add("hopwise/elastic/tickets", 0);
  } catch (const Error& e) {  // a damaged count lets nobody in; the members train on (the minimum says so to all)
    if (!ticket_count_unreadable_)
      log::warn(
          "elastic: rank {} cannot read the store's ticket count, so no newcomer is let in until it reads "
          "again: {}",
          comm_->rank(), e.what());
    ticket_count_unreadable_ = true;
    waiting_ = admitted_;
  }
  comm_->allreduce(&waiting_, &waiting_, 1, DataType::kInt64, ReduceOp::kMin);
  if (waiting_ - admitted_ > kMostNewcomers) {  // alike on every member: the minimum is
    if (waiting_ != refused_tickets_ && comm_->rank() == 0)
      log::warn(
          "elastic: the store's ticket count says {} processes wait to join, more than {} at once: a damaged or "
          "hostile store, not newcomers; none is let in until the count is back within reach",
          waiting_ - admitted_, kMostNewcomers);
    refused_tickets_ = waiting_;
    return false;
  }
  return waiting_ > admitted_;
}

bool ElasticGroup::newcomers_waiting(std::int64_t step) {
  if (!options_.grow || step % options_.grow_every != 0) return false;
  return newcomers_waiting();
}

ElasticEvent ElasticGroup::admit() {
  const std::int64_t seen = waiting_;
  const auto t0 = Clock::now();
  ElasticEvent event;
  std::vector<int> next = members_;
  const std::vector<int> before = members_;
  const std::int64_t g = generation_ + 1;
  const std::int64_t first_id = next_id_;
  for (std::int64_t t = admitted_ + 1; t <= seen; ++t) next.push_back(static_cast<int>(next_id_++));
  if (comm_->rank() == 0) {
    store_->set(key(g, "members"), member_list_text(next));
    for (std::int64_t t = admitted_ + 1; t <= seen; ++t)
      store_->set(fmt::format("hopwise/elastic/admitted/{}", t),
                  admission_text({g, first_id + (t - admitted_ - 1), seen, next_id_}));
  }
  admitted_ = seen;
  try {
    build(g, next);
    event.joined.assign(next.begin() + static_cast<std::ptrdiff_t>(before.size()), next.end());
  } catch (const Error& e) {
    // A newcomer that took its ticket and died (or never came) leaves the generation unformed on every member: the
    // members agree on who is here, as after a lost rank, and go on without it.
    const std::vector<int> here =
        agree_on_survivors(*store_, g, id_, members_, options_, Store::Seconds(comm_options_.timeout_s),
                           fmt::format("generation {} (letting in {} newcomer(s)) did not form: {}", g,
                                       next.size() - before.size(), e.what()));
    for (int m : next) {
      if (contains(here, m)) {
        if (!contains(before, m)) event.joined.push_back(m);
      } else {
        (contains(before, m) ? event.left : event.not_arrived).push_back(m);
      }
    }
    if (!event.left.empty() && !options_.shrink)
      throw Error(
          fmt::format("elastic: rank(s) {} were lost while newcomers were let in, and HOPWISE_ELASTIC lacks "
                      "shrink: {}",
                      fmt::join(event.left, ", "), e.what()));
    build(g + 1, here);
  }
  event.generation = generation_;
  event.members = members_;
  event.stood_still_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return event;
}

std::unique_ptr<ElasticGroup> ElasticGroup::from_launch(ElasticOptions options, Options comm_options) {
  Launch l = detect_launch();
  if (l.store.empty() && l.size > 1)
    throw InvalidArgument(fmt::format(
        "HOPWISE_ELASTIC: {} runs over {}, which cannot shrink (MPI cannot shrink a world communicator); set "
        "HOPWISE_TRANSPORT=ucx so that the ranks meet through a store",
        l.launcher, l.transport));
  const Store::Seconds timeout(comm_options.timeout_s);
  if (options.join) {
    if (l.size < 2)
      throw InvalidArgument(
          "HOPWISE_ELASTIC_JOIN=1: give the job's variables (WORLD_SIZE, MASTER_ADDR and MASTER_PORT or "
          "HOPWISE_STORE) so that this process finds its store");
    l.rank = std::max(l.rank, 1);  // a newcomer never serves the store
    return join(launch_store(l, timeout), options, std::move(comm_options));
  }
  return std::make_unique<ElasticGroup>(l.size > 1 ? launch_store(l, timeout) : std::make_shared<InProcessStore>(),
                                        l.rank, l.size, options, std::move(comm_options));
}

// The generation and its members are this member's before its transport meets: a failure to meet (a member or
// newcomer that never came) leaves them, so that the agreement that follows is on this generation, and no
// communicator (shrink() and admit() then agree through the store alone).
void ElasticGroup::build(std::int64_t generation, std::vector<int> members) {
  comm_.reset();  // the old generation's first: its transport lets go of the peers that are gone
  generation_ = generation;
  members_ = std::move(members);
  // Beating from before the first transport meets (its wait may be long); under grow too, so that a newcomer that
  // dies while the members wait for it is told from one that is only slow.
  if ((options_.shrink || options_.grow) && !heartbeat_)
    heartbeat_ = std::make_unique<ElasticHeartbeat>(store_, id_, options_.heartbeat_period());
  const auto at = std::find(members_.begin(), members_.end(), id_);
  if (at == members_.end())
    throw Error(fmt::format("elastic: member {} is not in generation {}'s list ({})", id_, generation,
                            member_list_text(members_).substr(0, 200)));
  const int rank = static_cast<int>(at - members_.begin()), size = static_cast<int>(members_.size());
  auto transport =
      transport_(store_, rank, size, key(generation, "transport"), Store::Seconds(comm_options_.timeout_s));
  comm_ = std::make_unique<Communicator>(std::move(transport), comm_options_);
}

namespace {

// Until every member of generation g marked itself alive, or each one still missing is lost (its heartbeat stood
// still for settle_s) or, beating still, has not answered `timeout` past settle_s. A member's heartbeat is first
// looked at when the wait starts: one lost earlier looks silent from then on.
void wait_for_members(Store& store, std::int64_t g, int id, const std::vector<int>& members,
                      const ElasticOptions& options, Store::Seconds timeout) {
  const auto t0 = Clock::now();
  const auto settle = std::chrono::duration_cast<Clock::duration>(Store::Seconds(options.settle_s));
  const auto give_up_on_the_living = t0 + settle + std::chrono::duration_cast<Clock::duration>(timeout);
  struct Beat {
    std::string count;
    Clock::time_point moved;
  };
  std::map<int, Beat> missing;
  Clock::time_point looked{};
  while (store.add(key(g, "alive"), 0) < static_cast<std::int64_t>(members.size())) {
    const auto now = Clock::now();
    if (now >= give_up_on_the_living) return;
    if (now - looked >= std::chrono::milliseconds(100)) {  // a look costs a few store calls per missing member
      looked = now;
      // Another survivor decided already (it began waiting earlier, so its window closed first): waiting on would
      // only make this one late to the next generation's transport, which its members meet within the timeout.
      if (store.check({key(g + 1, "members")})) return;
      bool someone_beats = false;
      for (int m : members) {
        if (m == id || store.check({key(g, fmt::format("alive/{}", m))})) continue;
        const std::string beat_key = elastic_beat_key(m);
        const std::string count = store.check({beat_key}) ? store.get(beat_key, timeout) : "";
        const auto [it, first] = missing.try_emplace(m, Beat{count, now});
        if (!first && it->second.count != count) it->second = {count, now};
        if (now - it->second.moved < settle) someone_beats = true;
      }
      if (!someone_beats) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::vector<int> agree_on_survivors(Store& store, std::int64_t generation, int id, const std::vector<int>& members,
                                    const ElasticOptions& options, Store::Seconds timeout, const std::string& why) {
  const auto t0 = Clock::now();
  const std::int64_t g = generation;
  std::vector<int> next;
  try {
    store.set(key(g, fmt::format("alive/{}", id)), "1");
    store.add(key(g, "alive"), 1);
    wait_for_members(store, g, id, members, options, timeout);
    if (store.add(key(g, "proposer"), 1) == 1) {  // the first to finish waiting writes the list
      std::vector<int> alive;
      for (int m : members)
        if (store.check({key(g, fmt::format("alive/{}", m))})) alive.push_back(m);
      store.set(key(g + 1, "members"), member_list_text(alive));
    }
    next = parse_member_list(store.get(key(g + 1, "members"), timeout));
  } catch (const std::exception& e) {
    throw Error(fmt::format(
        "elastic: rank {} cannot agree with the survivors of generation {} through the store ({}); a store served by "
        "a rank dies with it: give the job one that outlives any rank (HOPWISE_STORE=file:///shared/dir). The "
        "failure: {}",
        id, g, e.what(), why));
  }
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!contains(next, id))
    throw Error(fmt::format(
        "elastic: rank {} was left out of generation {}: ranks {} agreed on it without this rank, which gave up on "
        "generation {} too late (its heartbeat stood still for {:.1f} s: the process was stopped or starved; or it "
        "answered over {:.1f} s after them); its model is stale, so it cannot re-enter: exit (a restart of the job "
        "brings it back)",
        id, g + 1, fmt::join(next, ", "), g, options.settle_s, options.settle_s + timeout.count()));
  if (next.size() == members.size())
    throw Error(fmt::format(
        "elastic: every rank of generation {} answered after {:.1f} s: the failure was not a lost rank, so shrinking "
        "cannot help: {}",
        g, waited, why));
  if (static_cast<int>(next.size()) < options.min_ranks)
    throw Error(fmt::format("elastic: only {} rank(s) left ({}), fewer than HOPWISE_ELASTIC_MIN_RANKS={}: {}",
                            next.size(), fmt::join(next, ", "), options.min_ranks, why));
  return next;
}

ElasticEvent ElasticGroup::shrink(const std::string& why) {
  const auto t0 = Clock::now();
  // A survivor may still wait on a stopped rank until its own timeout, which the ring staggers past the others'
  // window: every peer is declared lost in the old transport, so that whoever still waits gives up now.
  // No communicator where the generation never formed (build() failed): nobody waits on it.
  for (int r = 0; comm_ && r < comm_->size(); ++r)
    if (r != comm_->rank()) comm_->transport().declare_lost(r);
  const std::vector<int> next =
      agree_on_survivors(*store_, generation_, id_, members_, options_, Store::Seconds(comm_options_.timeout_s), why);
  ElasticEvent event;
  for (int m : members_)
    if (!contains(next, m)) event.left.push_back(m);
  build(generation_ + 1, next);
  event.generation = generation_;
  event.members = members_;
  event.stood_still_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return event;
}

}  // namespace hopwise::comm
