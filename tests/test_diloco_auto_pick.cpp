// diloco:auto's pick on busy cores (auto_pick.h), on figures the probe read on this project's CPU trainers: the
// syncs' other work measured on the probe's blocking syncs, the fewest bits first, and the period each inner
// optimizer's family lets that work lengthen.
#include <gtest/gtest.h>

#include <string>

#include "../training/src/averaging/auto_pick.h"
#include "hopwise/training/averaging_method.h"

namespace hc = hopwise::comm;
namespace hd = hopwise::comm::detail;

namespace {

// The torch MLP at 1 Gbit/s (1.86M parameters, 15 ms of compute a step, 7.45 MB in 65 ms), with `other` ms a model's
// worth of the syncs' other work put into the probe's blocking int4 fragment.
hd::LinkProbe mlp(double other) {
  hd::LinkProbe link{15.35, 64.64, 7454760, {{"none", 1.0, 0.0}, {"int8", 0.26, 3.0}, {"int4", 0.14, 4.0}}, 0.82};
  link.fragment_ms = (link.full_ms * 0.14 + 4.0 + other) / hd::kStreamedPeriod;
  return link;
}

}  // namespace

TEST(DilocoAutoPick, TheSyncsOtherWorkIsWhatTheProbesBlockingSyncLeftUnexplained) {
  EXPECT_NEAR(hd::sync_overhead_ms(mlp(17.4)), 17.4, 1e-9);
  EXPECT_EQ(hd::sync_overhead_ms(mlp(-5)), 0) << "a sync faster than the model explains adds nothing";
  hd::LinkProbe unmeasured = mlp(17.4);
  unmeasured.fragment_ms = 0;
  EXPECT_EQ(hd::sync_overhead_ms(unmeasured), 0);
  unmeasured = mlp(17.4);
  unmeasured.codecs.pop_back();  // no int4 (kProbeCodec): the probe's codec unknown
  EXPECT_EQ(hd::sync_overhead_ms(unmeasured), 0);
}

// SGD's inner steps start at the period of their outer rule's Nesterov step (128) and take a longer one where the
// syncs' other work asks it.
TEST(DilocoAutoPick, SgdInnerStepsTakeThePeriodTheSyncsOtherWorkAsks) {
  const auto spec = hc::AveragingSpec::parse("diloco:auto,inner=sgd");
  const hd::AutoChoice without = hd::pick_outer(mlp(0), spec, 2);
  const hd::AutoChoice with = hd::pick_outer(mlp(300), spec, 2);
  EXPECT_EQ(without.settings.period, 128) << without.why;
  EXPECT_EQ(without.settings.momentum, 0.9) << without.why;
  // the syncs rare there: the idle order, the fewest lost bits and fragments first
  EXPECT_EQ(without.settings.codec, "none") << without.why;
  EXPECT_EQ(without.settings.fragments, 1) << without.why;
  EXPECT_NE(without.why.find("from 128, where inner sgd's outer rule takes its momentum step"), std::string::npos)
      << without.why;
  EXPECT_EQ(hd::pick_outer(mlp(17.4), spec, 2).settings.period, 128);
  EXPECT_GT(with.settings.period, 128) << with.why;
  EXPECT_GE(with.utilization, 0.95) << with.why;
  EXPECT_NE(with.why.find("300.00 ms a model's worth of the syncs' other work"), std::string::npos) << with.why;
  // on idle cores the work runs on a core of its own: not counted
  hd::LinkProbe idle = mlp(17.4);
  idle.cores_busy = 0.3;
  EXPECT_EQ(hd::pick_outer(idle, spec, 2).why.find("other work"), std::string::npos);
}

TEST(DilocoAutoPick, AdaptiveInnerStepsKeepTheStreamedPeriodAboveHalfUtilization) {
  for (const char* inner : {"adam", "muon", ""}) {
    const auto spec = hc::AveragingSpec::parse(std::string("diloco:auto") + (*inner ? ",inner=" : "") + inner);
    const hd::AutoChoice c = hd::pick_outer(mlp(17.4), spec, 2);
    EXPECT_EQ(c.settings.period, hd::kStreamedPeriod) << inner << ": " << c.why;
    EXPECT_GE(c.utilization, hd::kLengthenBelow) << c.why;
    EXPECT_NE(c.why.find("keeps period 4 above 50%"), std::string::npos) << c.why;
    // where even the streamed period would keep under half, the period grows for every family
    const hd::AutoChoice heavy = hd::pick_outer(mlp(200), spec, 2);
    EXPECT_GT(heavy.settings.period, hd::kStreamedPeriod) << inner << ": " << heavy.why;
  }
}

TEST(DilocoAutoPick, BusyCoresTakeTheFewestBitsThatReach) {
  // the LM at 100 Mbit/s: int8 and int4 both hidden behind a step's delay; int4's bytes cost the cores less
  hd::LinkProbe link{188, 1294, 13031424, {{"none", 1.0, 0.0}, {"int8", 0.26, 15.0}, {"int4", 0.14, 20.0}}, 0.8};
  const hd::AutoChoice c = hd::pick_outer(link, hc::AveragingSpec::parse("diloco:auto,inner=adam"), 2);
  EXPECT_EQ(c.settings.period, 4) << c.why;
  EXPECT_EQ(c.settings.fragments, 4) << c.why;
  EXPECT_EQ(c.settings.delay, 1) << c.why;
  EXPECT_EQ(c.settings.codec, "int4") << c.why;
  link.cores_busy = 0.5;  // idle cores: the fewest lost bits first
  EXPECT_NE(hd::pick_outer(link, hc::AveragingSpec::parse("diloco:auto,inner=adam"), 2).settings.codec, "int4");
}
