// ElasticGroup's agreement over a store, with ranks as threads (in-process transports, one world per generation):
// the survivors of a lost rank agree on one list and go on; a rank that answers late is refused, naming the
// generation; a slow rank whose heartbeat moves is waited for, a stopped one left out; a newcomer is let in at a
// boundary; a failure that lost no rank is not hidden; bad modes are named.
// NeighbourCopy: each rank holds its ring predecessor's last complete state, which outlives the predecessor.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "elastic_worlds.h"
#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/common/error.h"
#include "hopwise/training/elastic.h"
#include "hopwise/training/neighbour_copy.h"
#include "inproc_group.h"

namespace {

namespace hc = hopwise::comm;
using hopwise::DataType;
using hopwise::ReduceOp;
using hwtest::elastic_options;
using hwtest::Worlds;

using hwtest::on_threads;

double sum_of_ids(hc::ElasticGroup& g) {
  double v = g.id() + 1;
  g.comm().allreduce(&v, &v, 1, DataType::kFloat64, ReduceOp::kSum);
  return v;
}

TEST(Elastic, SurvivorsOfALostRankAgreeAndGoOn) {
  auto store = std::make_shared<hc::InProcessStore>();
  Worlds worlds;
  std::vector<std::vector<int>> seen(4);
  std::vector<double> sums(4, 0);
  const auto errors = on_threads(4, [&](int id) {
    hc::ElasticGroup g(store, id, 4, elastic_options(), hwtest::test_options(hc::Algorithm::kAuto, 256 << 10, 1),
                       worlds.factory());
    if (id == 2) return;  // this rank is lost: it never calls again
    double v = 1;
    try {
      g.comm().allreduce(&v, &v, 1, DataType::kFloat64, ReduceOp::kSum);
      FAIL() << "the allreduce went through without rank 2";
    } catch (const hopwise::Error& e) {
      const hc::ElasticEvent ev = g.shrink(e.what());
      EXPECT_EQ(ev.left, std::vector<int>{2});
      EXPECT_EQ(ev.generation, 1);
      seen[static_cast<std::size_t>(id)] = ev.members;
    }
    sums[static_cast<std::size_t>(id)] = sum_of_ids(g);
  });
  for (int id : {0, 1, 3}) {
    EXPECT_EQ(errors[static_cast<std::size_t>(id)], "") << "rank " << id;
    EXPECT_EQ(seen[static_cast<std::size_t>(id)], (std::vector<int>{0, 1, 3})) << "rank " << id;
    EXPECT_EQ(sums[static_cast<std::size_t>(id)], 1 + 2 + 4) << "rank " << id;
  }
}

TEST(Elastic, ARankThatAnswersAfterTheAgreementIsRefused) {
  auto store = std::make_shared<hc::InProcessStore>();
  Worlds worlds;
  const auto errors = on_threads(3, [&](int id) {
    hc::ElasticGroup g(store, id, 3, elastic_options(), hwtest::test_options(hc::Algorithm::kAuto, 256 << 10, 1),
                       worlds.factory());
    if (id == 1) {  // beating, but silent past the others' wait (settle + timeout), then back
      while (!store->check({"hopwise/elastic/1/members"})) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      g.shrink("it was stopped");
      return;
    }
    double v = 1;
    try {
      g.comm().allreduce(&v, &v, 1, DataType::kFloat64, ReduceOp::kSum);
    } catch (const hopwise::Error& e) {
      g.shrink(e.what());
    }
    EXPECT_EQ(g.members(), (std::vector<int>{0, 2}));
    EXPECT_EQ(sum_of_ids(g), 1 + 3);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[2], "");
  EXPECT_NE(errors[1].find("rank 1 was left out of generation 1: ranks 0, 2 agreed on it without this rank"),
            std::string::npos)
      << errors[1];
}

// The agreement alone, each thread a member with a heartbeat of its own: a 1 s window (beats every 0.25 s, so that a
// busy machine's late beat does not look like silence), and a timeout of 60 s, which neither test may wait out: the
// agreement must end on the members' answers and heartbeats, not on the clock.
hc::ElasticOptions beating() {
  hc::ElasticOptions o = elastic_options();
  o.settle_s = 1;
  return o;
}
constexpr hc::Store::Seconds kTimeout{60.0};

TEST(Elastic, ASlowRankWhoseHeartbeatMovesIsWaitedFor) {
  auto store = std::make_shared<hc::InProcessStore>();
  const std::vector<int> members = {0, 1, 2, 3};
  std::vector<std::vector<int>> next(4);
  const auto errors = on_threads(4, [&](int id) {
    hc::ElasticHeartbeat beat(store, id, beating().heartbeat_period());
    if (id == 2) return;  // lost: its heartbeat ends with it
    if (id == 1) {        // slow: it answers three windows after the others began waiting, beating meanwhile
      while (store->add("hopwise/elastic/0/alive", 0) < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::this_thread::sleep_for(std::chrono::seconds(3));
    }
    next[static_cast<std::size_t>(id)] = hc::agree_on_survivors(*store, 0, id, members, beating(), kTimeout, "lost");
  });
  // Without the heartbeat ranks 0 and 3 would have agreed on {0, 3} and rank 1 would be refused.
  for (int id : {0, 1, 3}) {
    EXPECT_EQ(errors[static_cast<std::size_t>(id)], "") << "rank " << id;
    EXPECT_EQ(next[static_cast<std::size_t>(id)], (std::vector<int>{0, 1, 3})) << "rank " << id;
  }
}

TEST(Elastic, AStoppedRankIsLeftOutOnceItsHeartbeatStandsStill) {
  auto store = std::make_shared<hc::InProcessStore>();
  const std::vector<int> members = {0, 1, 2};
  std::vector<double> waited(3, 0);
  const auto errors = on_threads(3, [&](int id) {
    auto beat = std::make_unique<hc::ElasticHeartbeat>(store, id, beating().heartbeat_period());
    if (id == 1) {  // stopped: its heartbeat stops with it; it answers once the others have agreed
      beat.reset();
      while (!store->check({"hopwise/elastic/1/members"})) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      hc::agree_on_survivors(*store, 0, id, members, beating(), kTimeout, "it was stopped");
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(hc::agree_on_survivors(*store, 0, id, members, beating(), kTimeout, "lost"), (std::vector<int>{0, 2}));
    waited[static_cast<std::size_t>(id)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[2], "");
  EXPECT_NE(errors[1].find("rank 1 was left out of generation 1: ranks 0, 2 agreed on it without this rank, which "
                           "gave up on generation 0 too late (its heartbeat stood still for 1.0 s"),
            std::string::npos)
      << errors[1];
  // Left out for its silence, not at the end of the wait for a beating rank (settle + the 60 s timeout).
  EXPECT_LT(std::max(waited[0], waited[2]), kTimeout.count());
}

TEST(Elastic, AFailureThatLostNoRankIsNotHidden) {
  auto store = std::make_shared<hc::InProcessStore>();
  Worlds worlds;
  const auto errors = on_threads(2, [&](int id) {
    hc::ElasticGroup g(store, id, 2, elastic_options(), hwtest::test_options(hc::Algorithm::kAuto, 256 << 10, 1),
                       worlds.factory());
    g.shrink("a mismatch");
  });
  for (const auto& e : errors) EXPECT_NE(e.find("every rank of generation 0 answered"), std::string::npos) << e;
  EXPECT_NE(errors[0].find("a mismatch"), std::string::npos);
}

TEST(Elastic, ANewcomerIsLetInAtABoundary) {
  auto store = std::make_shared<hc::InProcessStore>();
  Worlds worlds;
  std::atomic<bool> joined{false};
  std::vector<double> sums(3, 0);
  const auto errors = on_threads(3, [&](int t) {
    const auto opts = hwtest::test_options(hc::Algorithm::kAuto, 256 << 10, 30);
    std::unique_ptr<hc::ElasticGroup> g;
    if (t == 2) {
      g = hc::ElasticGroup::join(store, elastic_options(true), opts, worlds.factory());
      EXPECT_TRUE(g->joined_late());
      joined = true;
    } else {
      g = std::make_unique<hc::ElasticGroup>(store, t, 2, elastic_options(true), opts, worlds.factory());
      // Steps go on until the newcomer has a ticket. Only every grow_every-th step asks (a collective): thread 1
      // makes extra calls at the steps between, which must answer without one (it would pair with nothing).
      std::int64_t step = 0;
      for (;; ++step) {
        ASSERT_LT(step, 100000);
        if (step % 10 != 0) {
          if (t == 1) {
            EXPECT_FALSE(g->newcomers_waiting(step));
          }
          continue;
        }
        if (g->newcomers_waiting(step)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_EQ(step % g->options().grow_every, 0);
      const hc::ElasticEvent ev = g->admit();
      EXPECT_EQ(ev.joined, std::vector<int>{2});
      EXPECT_EQ(ev.members, (std::vector<int>{0, 1, 2}));
    }
    EXPECT_EQ(g->generation(), 1);
    sums[static_cast<std::size_t>(t)] = sum_of_ids(*g);
  });
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(errors[static_cast<std::size_t>(t)], "") << "thread " << t;
    EXPECT_EQ(sums[static_cast<std::size_t>(t)], 1 + 2 + 3) << "thread " << t;
  }
  EXPECT_TRUE(joined);
}

// Worlds whose members meet through the store as UCX's do: each waits (up to the timeout) until all `size` arrived,
// so that a member that never comes fails the generation on every other one.
hc::ElasticGroup::TransportFactory meeting(Worlds& worlds) {
  return [&worlds](std::shared_ptr<hc::Store> store, int rank, int size, const std::string& key,
                   hc::Store::Seconds timeout) {
    store->add(key + "/arrived", 1);
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (store->add(key + "/arrived", 0) < size) {
      if (std::chrono::steady_clock::now() > until) throw hopwise::TimeoutError(key + ": a member did not arrive", {});
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return worlds.factory()(store, rank, size, key, timeout);
  };
}

// Steps until the members let newcomers in (a boundary every 10 steps); the event.
hc::ElasticEvent admit_at_a_boundary(hc::ElasticGroup& g) {
  for (std::int64_t step = 0;; step += 10) {
    if (step > 100000) throw hopwise::Error("no newcomer was seen");
    if (g.newcomers_waiting(step)) return g.admit();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// A newcomer that took its ticket and died: the members let it in, its generation never forms (before the change
// every member then used the communicator build() had let go of: a segfault), they time it out, agree on who is
// here and go on.
TEST(Elastic, ANewcomerThatDiesAfterItsTicketIsTimedOut) {
  auto store = std::make_shared<hc::InProcessStore>();
  Worlds worlds;
  std::vector<hc::ElasticEvent> events(2);
  std::vector<double> sums(2, 0);
  const auto errors = on_threads(2, [&](int id) {
    // 3 s for the two members to meet (a loaded machine); the newcomer never does.
    const auto opts = hwtest::test_options(hc::Algorithm::kAuto, 256 << 10, 3);
    hc::ElasticGroup g(store, id, 2, elastic_options(true), opts, meeting(worlds));
    if (id == 0) store->add("hopwise/elastic/tickets", 1);  // the newcomer's ticket; it dies before anything else
    events[static_cast<std::size_t>(id)] = admit_at_a_boundary(g);
    sums[static_cast<std::size_t>(id)] = sum_of_ids(g);
  });
  for (int id = 0; id < 2; ++id) {
    const auto& ev = events[static_cast<std::size_t>(id)];
    EXPECT_EQ(errors[static_cast<std::size_t>(id)], "") << "member " << id;
    EXPECT_EQ(ev.not_arrived, std::vector<int>{2});
    EXPECT_TRUE(ev.joined.empty() && ev.left.empty());
    EXPECT_EQ(ev.generation, 2);
    EXPECT_EQ(ev.members, (std::vector<int>{0, 1}));
    EXPECT_NE(ev.describe().find("newcomer(s) 2 let in but never arrived (timed out); 2 rank(s) go on (0, 1)"),
              std::string::npos)
        << ev.describe();
    EXPECT_EQ(sums[static_cast<std::size_t>(id)], 1 + 2);
  }
}

// A ticket count no crowd of newcomers gives (2^40 once made every member allocate an id per ticket: bad_alloc at
// 2.3 GB), or one that is not a number: nobody is let in, the members go on; a sane count later is honoured.
TEST(Elastic, TicketCountsOutOfReachLetNobodyIn) {
  for (const std::string planted : {"1099511627776", "1025", "seven", "-3"}) {
    auto store = std::make_shared<hc::InProcessStore>();
    Worlds worlds;
    const auto errors = on_threads(2, [&](int id) {
      hc::ElasticGroup g(store, id, 2, elastic_options(true), hwtest::test_options(hc::Algorithm::kAuto, 256 << 10, 30),
                         worlds.factory());
      if (id == 0) store->set("hopwise/elastic/tickets", planted);
      g.comm().barrier();
      EXPECT_FALSE(g.newcomers_waiting()) << planted;
      EXPECT_EQ(g.generation(), 0);
      EXPECT_EQ(sum_of_ids(g), 1 + 2);
    });
    for (const auto& e : errors) EXPECT_EQ(e, "") << planted;
  }
}

// What a newcomer reads from the store is checked before use: a garbled answer or a member list that lacks it or
// names a rank twice is a named error, not "stoll" nor a rank out of range.
TEST(Elastic, ANewcomerRefusesAGarbledAnswer) {
  for (const auto& [answer, members, expect] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"seven 2 1 3", "0,1,2", "answer to ticket 1 'seven 2 1 3' is not one hopwise writes"},
           {"1 2 1 1099511627777", "0,1,2", "is not one hopwise writes"},
           {"1 2 1", "0,1,2", "answer to ticket 1 '1 2 1' is not one hopwise writes"},
           {"1 5 1 3", "0,1,2", "answer to ticket 1 '1 5 1 3' is not one hopwise writes"},
           {"1 2 1 3", "0,1", "its member list (0,1) lacks that id"},
           {"1 2 1 3", "0,1,2,2", "names a rank twice"},
           {"1 2 1 3", "0,x", "'0,x' is not a list of ranks"}}) {
    auto store = std::make_shared<hc::InProcessStore>();
    Worlds worlds;
    store->set("hopwise/elastic/admitted/1", answer);
    store->set("hopwise/elastic/1/members", members);
    try {
      hc::ElasticGroup::join(store, elastic_options(true), hwtest::test_options(hc::Algorithm::kAuto, 256 << 10, 1),
                             worlds.factory());
      ADD_FAILURE() << answer << " / " << members << " was taken";
    } catch (const hopwise::Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  }
}

// Rank r's state at step s: values no other rank or step has.
float state_value(int r, std::int64_t step, std::size_t i) {
  return static_cast<float>(r) * 1000.0f + static_cast<float>(step) + static_cast<float>(i) * 1e-3f;
}

TEST(Elastic, EachRankHoldsItsPredecessorsLastState) {
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1009}, std::size_t{300001}}) {
    for (const int n : {1, 2, 4}) {
      hwtest::Group group(n, hwtest::test_options());
      const std::vector<int> ids = {10, 11, 12, 13};  // an elastic group's member ids, not its ranks
      const std::string err = group.run([&](int r, hc::Communicator& c) {
        hc::NeighbourCopy copy(count);
        std::vector<float> mine(count);
        for (std::int64_t step = 0; step < 3; ++step) {
          for (std::size_t i = 0; i < count; ++i) mine[i] = state_value(r, step, i);
          copy.start(c, mine.data(), step, std::vector<int>(ids.begin(), ids.begin() + n));
          copy.settle();
        }
        if (n == 1) {
          EXPECT_FALSE(copy.holds()) << "a single rank keeps no copy";
          return;
        }
        const int pred = (r + n - 1) % n;
        ASSERT_EQ(copy.held_id(), ids[static_cast<std::size_t>(pred)]) << "rank " << r;
        EXPECT_EQ(copy.held_step(), 2);
        for (std::size_t i = 0; i < count; ++i)
          ASSERT_EQ(copy.held()[i], state_value(pred, 2, i)) << "rank " << r << " element " << i << " of " << count;
      });
      EXPECT_EQ(err, "") << n << " ranks, " << count << " floats";
    }
  }
}

TEST(Elastic, ACopyOutlivesItsLostOwner) {
  hwtest::Group group(4, hwtest::test_options(hc::Algorithm::kAuto, 256 << 10, 1));
  const std::size_t count = 4099;
  std::vector<std::string> settle_errors(4);
  std::vector<std::vector<float>> held(4);
  std::vector<std::int64_t> held_step(4, -1);
  const std::string err = group.run([&](int r, hc::Communicator& c) {
    hc::NeighbourCopy copy(count);
    std::vector<float> mine(count);
    for (std::int64_t step = 0; step < 3; ++step) {
      if (r == 2 && step == 2) return;  // lost before sending the state step 2 started from
      for (std::size_t i = 0; i < count; ++i) mine[i] = state_value(r, step, i);
      copy.start(c, mine.data(), step, {0, 1, 2, 3});
      try {
        copy.settle();
      } catch (const hopwise::Error& e) {
        settle_errors[static_cast<std::size_t>(r)] = e.what();
        break;
      }
    }
    held[static_cast<std::size_t>(r)].assign(copy.held(), copy.held() + count);
    held_step[static_cast<std::size_t>(r)] = copy.held_step();
    EXPECT_EQ(copy.held_id(), (r + 3) % 4);
  });
  ASSERT_EQ(err, "");
  // Rank 3, rank 2's successor, names the failure and still holds rank 2's state of step 1, whole.
  EXPECT_NE(settle_errors[3], "") << "rank 3 settled a copy that rank 2 never sent";
  EXPECT_EQ(held_step[3], 1);
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(held[3][i], state_value(2, 1, i)) << "element " << i;
}

TEST(Elastic, ModesAreCheckedByName) {
  EXPECT_TRUE(hc::ElasticOptions::parse("shrink").shrink);
  const auto both = hc::ElasticOptions::parse("shrink,grow");
  EXPECT_TRUE(both.shrink && both.grow);
  EXPECT_FALSE(hc::ElasticOptions::parse("off").shrink);
  try {
    hc::ElasticOptions::parse("shrink,expand");
    FAIL() << "an unknown mode was taken";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'expand' is not a mode; use shrink"), std::string::npos) << e.what();
  }
  ::setenv("HOPWISE_ELASTIC_COPY_EVERY", "8", 1);
  EXPECT_EQ(hc::ElasticOptions::parse("shrink").copy_every, 8);
  ::unsetenv("HOPWISE_ELASTIC_COPY_EVERY");
  EXPECT_EQ(hc::ElasticOptions::parse("grow").grow_every, 10);
  // A step count of 0 is refused, naming the variable.
  for (const char* name : {"HOPWISE_ELASTIC_COPY_EVERY", "HOPWISE_ELASTIC_GROW_EVERY"}) {
    ::setenv(name, "0", 1);
    try {
      hc::ElasticOptions::parse("shrink,grow");
      ADD_FAILURE() << name << "=0 was taken";
    } catch (const hopwise::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(name) + "=0: give a step count of 1 or more"), std::string::npos)
          << e.what();
    }
    ::unsetenv(name);
  }
}

}  // namespace
