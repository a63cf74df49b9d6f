// DiLoCo through a change of members (ModelAverager::detach and regroup, training/src/averaging/outer_regroup.cpp),
// ranks as threads over the in-process worlds an ElasticGroup rebuilds at each generation:
// - a replica lost before a sync (blocking, delayed, fragmented, alpha, a codec): the survivors give up on the sync
//   within the timeout, agree, keep the outer state they share (synced model, outer momentum) and redo the sync over
//   themselves; each ends where a serial replay that drops the lost replica's pseudo-gradient from that sync on ends;
// - a newcomer let in after a full average takes the synced model, outer momentum and step count, and every replica
//   ends with the same bits as the replay that adds a replica there (momentum kept, not started over).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "averaging_problem.h"
#include "elastic_worlds.h"
#include "hopwise/common/error.h"
#include "hopwise/training/averaging_method.h"
#include "inproc_group.h"
#include "outer_reference.h"

namespace {

using namespace hwtest::averaging;
using hwtest::on_threads;

std::vector<float> start_model() {
  std::vector<float> x(kDim);
  for (std::size_t i = 0; i < kDim; ++i) x[i] = std::cos(static_cast<float>(i));
  return x;
}

// The serial replay: `n` replicas from one start; replica `lost` drops out after its optimizer step `lost_at`
// (before that step's sync); a replica `joiner` comes in after the full average at step `join_at` with the synced
// model and no inner momentum. Returns the replicas' models after the last full average, in id order.
Models replay(const std::string& spec, int n, int steps, int lost, int lost_at, int join_at = 0) {
  const hc::AveragingSpec s = hc::AveragingSpec::parse(spec);
  std::vector<int> ids;
  for (int r = 0; r < n; ++r) ids.push_back(r);
  Models x(static_cast<std::size_t>(n), start_model()), v(static_cast<std::size_t>(n), std::vector<float>(kDim, 0));
  OuterReference outer(s, kDim);
  outer.start(x);
  std::vector<float> g(kDim);
  for (int t = 1; t <= steps; ++t) {
    for (std::size_t j = 0; j < ids.size(); ++j) {
      gradient(ids[j], t, x[j].data(), g.data());
      sgd(x[j].data(), v[j].data(), g.data());
    }
    for (std::size_t j = 0; j < ids.size(); ++j)
      if (ids[j] == lost && t == lost_at) {
        ids.erase(ids.begin() + static_cast<long>(j));
        x.erase(x.begin() + static_cast<long>(j));
        v.erase(v.begin() + static_cast<long>(j));
      }
    outer.after_step(x, t);
    if (t == join_at) {
      outer.full_average(x);
      ids.push_back(n);
      x.push_back(x[0]);
      v.emplace_back(kDim, 0.0f);
    }
  }
  outer.full_average(x);
  return x;
}

void expect_same(const Models& got, const Models& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(std::memcmp(got[r].data(), got[0].data(), kDim * sizeof(float)), 0)
        << what << ": replica " << r << " ended with other bits than replica 0";
    EXPECT_EQ(compare(got[r], want[r], tolerance), "") << what << ": replica " << r;
  }
}

struct Case {
  std::string spec;
  int lost_at;  // a step with a fragment due (rank 2 stops before launching it)
  double tolerance;
};

TEST(ElasticDiloco, SurvivorsOfALostReplicaGoOnFromTheSharedOuterState) {
  const std::vector<Case> cases = {
      {"diloco:period=4,outer_lr=0.7,momentum=0.9", 8, 2e-4},
      {"diloco:period=4,outer_lr=1,momentum=0", 8, 2e-4},  // plain averaging: no synced model, the sync redone
      {"diloco:period=4,fragments=2,delay=1,outer_lr=0.7,momentum=0.9", 10, 2e-4},
      {"diloco:period=6,fragments=3,delay=2,alpha=0.5,outer_lr=0.7,momentum=0.9,nesterov=0", 8, 2e-4},
      {"diloco:period=4,fragments=2,delay=1,codec=int8,outer_lr=0.7,momentum=0.9", 10, 0.1},  // int8's rounding
  };
  constexpr int kSteps = 21, kLost = 2;
  for (const Case& c : cases) {
    auto store = std::make_shared<hc::InProcessStore>();
    hwtest::Worlds worlds;
    Models got(2);
    std::vector<std::string> said(2);
    const auto errors = on_threads(3, [&](int id) {
      hc::ElasticGroup g(store, id, 3, hwtest::elastic_options(), hwtest::test_options(hc::Algorithm::kAuto, 4096, 3),
                         worlds.factory());
      std::vector<float> x = start_model(), v(kDim, 0.0f), grad(kDim);
      hc::ModelAverager avg(g.comm(), hc::AveragingSpec::parse(c.spec), x.data(), kDim);
      ASSERT_TRUE(avg.regroups());
      for (std::int64_t t = 1; t <= kSteps; ++t) {
        gradient(id, t, x.data(), grad.data());
        sgd(x.data(), v.data(), grad.data());
        if (id == kLost && t == c.lost_at) return;  // lost: never calls again
        try {
          avg.after_step();
        } catch (const hopwise::Error& e) {
          avg.detach();
          g.shrink(e.what());
          said[static_cast<std::size_t>(id)] = avg.regroup(g.comm());
          EXPECT_EQ(avg.steps(), t);
        }
      }
      avg.full_average();
      got[static_cast<std::size_t>(id)] = x;
    });
    for (int id = 0; id < 2; ++id) {
      EXPECT_EQ(errors[static_cast<std::size_t>(id)], "") << c.spec << ": rank " << id;
      EXPECT_NE(said[static_cast<std::size_t>(id)].find("redone over the 2 replica(s) here"), std::string::npos)
          << c.spec << ": " << said[static_cast<std::size_t>(id)];
    }
    expect_same(got, replay(c.spec, 3, kSteps, kLost, c.lost_at), c.tolerance, c.spec);
  }
}

// The same loss replayed without dropping the lost replica's share (as if it had been averaged in) ends elsewhere:
// the check above can tell the two apart.
TEST(ElasticDiloco, TheReplayTellsADroppedShareFromAKeptOne) {
  const Case c{"diloco:period=4,outer_lr=0.7,momentum=0.9", 8, 2e-4};
  const Models dropped = replay(c.spec, 3, 21, 2, c.lost_at), kept = replay(c.spec, 3, 21, -1, 0);
  EXPECT_NE(compare(dropped[0], kept[0], c.tolerance), "");
}

TEST(ElasticDiloco, ANewcomerTakesTheSyncedModelMomentumAndStep) {
  const std::string spec = "diloco:period=4,fragments=2,delay=1,outer_lr=0.7,momentum=0.9";
  constexpr int kSteps = 22, kJoinAt = 8;
  auto store = std::make_shared<hc::InProcessStore>();
  hwtest::Worlds worlds;
  Models got(3);
  std::vector<std::string> said(3);
  const auto errors = on_threads(3, [&](int t) {
    const auto opts = hwtest::test_options(hc::Algorithm::kAuto, 4096, 30);
    std::vector<float> x = start_model(), v(kDim, 0.0f), grad(kDim);
    std::unique_ptr<hc::ElasticGroup> g;
    std::optional<hc::ModelAverager> avg;
    std::int64_t from = 1;
    if (t == 2) {
      std::fill(x.begin(), x.end(), 7.0f);  // nothing of its own survives: it takes the synced model
      g = hc::ElasticGroup::join(store, hwtest::elastic_options(true), opts, worlds.factory());
      avg.emplace(g->comm(), hc::AveragingSpec::parse(spec), x.data(), kDim, nullptr, /*joining=*/true);
      said[2] = avg->regroup(g->comm());
      from = avg->steps() + 1;
      EXPECT_EQ(avg->steps(), kJoinAt);
    } else {
      g = std::make_unique<hc::ElasticGroup>(store, t, 2, hwtest::elastic_options(true), opts, worlds.factory());
      avg.emplace(g->comm(), hc::AveragingSpec::parse(spec), x.data(), kDim);
    }
    for (std::int64_t s = from; s <= kSteps; ++s) {
      gradient(t, s, x.data(), grad.data());
      sgd(x.data(), v.data(), grad.data());
      avg->after_step();
      if (s == kJoinAt && t < 2) {
        avg->full_average();
        while (!g->newcomers_waiting()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        g->admit();
        said[static_cast<std::size_t>(t)] = avg->regroup(g->comm());
      }
    }
    avg->full_average();
    got[static_cast<std::size_t>(t)] = x;
  });
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(errors[static_cast<std::size_t>(t)], "") << "thread " << t;
    EXPECT_NE(said[static_cast<std::size_t>(t)].find("sent to the newcomer(s) from rank 0"), std::string::npos)
        << said[static_cast<std::size_t>(t)];
  }
  expect_same(got, replay(spec, 2, kSteps, -1, 0, kJoinAt), 2e-4, "a newcomer at step 8");
}

TEST(ElasticDiloco, OnlyFixedDilocoRegroups) {
  for (const auto& [spec, want] :
       std::vector<std::pair<std::string, bool>>{{"diloco:period=8", true},
                                                 {"diloco:period=8,codec=int8,outer_lr=1,momentum=0", true},
                                                 {"diloco:period=8,outer_lr=1,momentum=0", true},
                                                 {"diloco:auto", false},
                                                 {"local:period=4", false},
                                                 {"sync", false}})
    EXPECT_EQ(hc::averaging_regroups(hc::AveragingSpec::parse(spec)), want) << spec;
  hwtest::Group g(1, hwtest::test_options());
  std::vector<float> x(4, 0.0f);
  hc::ModelAverager local(g.comm(0), hc::AveragingSpec::parse("local:period=4"), x.data(), x.size());
  try {
    local.regroup(g.comm(0));
    FAIL() << "local regrouped";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("keeps no state across a change of members"), std::string::npos) << e.what();
  }
}

}  // namespace
