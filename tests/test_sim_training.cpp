// A training step on simulated ranks (sim/: hopwise/sim/training.h): the models and methods it
// parses, and each method's simulated period against what the platform's lone allreduce takes (tests/sim/
// cluster8.xml: 8 hosts on 1 Gbit/s links), with the element-wise work free so that only the network counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/sim/rank_collectives.h"
#include "hopwise/sim/training.h"
#include "hopwise/sim/tuner.h"
#include "sim_platform.h"

namespace {

namespace hc = hopwise::comm;
namespace sim = hopwise::comm::sim;
using hopwise::DataType;
using hopwise::comm::sim::testing::load;

// n ranks, rank r on host r % hosts.
struct Job {
  std::vector<std::string> hosts;
  std::vector<int> host_of, ring;
};
Job job(int n, int hosts) {
  Job j;
  const auto names = sim::host_names();
  for (int r = 0; r < n; ++r) {
    j.hosts.push_back(names[static_cast<std::size_t>(r % hosts)]);
    j.host_of.push_back(r % hosts);
  }
  for (int h = 0; h < hosts; ++h)  // the planned ring: each host's ranks together
    for (int r = h; r < n; r += hosts) j.ring.push_back(r);
  return j;
}

sim::RunOptions free_work() {
  sim::RunOptions o;
  o.real_payloads = false;
  return o;
}

const sim::ChooseAlgorithm ring = [](const sim::StepCall&) { return hc::TuningChoice{hc::Algorithm::kRing}; };

// The simulated seconds of one float32 allreduce of `count` on the ring.
double lone_allreduce(const Job& j, std::size_t count) {
  std::vector<float> buf(std::max<std::size_t>(count, 1));
  return sim::run_ranks(
      j.hosts,
      [&](int, hc::Transport& t) {
        sim::RankCollectives coll(t, j.ring, j.host_of, 256u << 10, true);
        coll.run(hc::Algorithm::kRing, hc::Collective::kAllreduce, buf.data(), buf.data(), count, DataType::kFloat32,
                 hopwise::ReduceOp::kAvg);
      },
      free_work());
}

sim::StepResult step(const Job& j, const std::string& model, const std::string& method, double compute_s,
                     double bucket_mb = 1) {
  sim::StepSettings s;
  s.compute_s = compute_s;
  s.bucket_mb = bucket_mb;
  s.first_bucket_mb = bucket_mb;
  return sim::simulate_step(j.hosts, j.ring, j.host_of, 256u << 10, free_work(), sim::parse_model(model),
                            sim::parse_method(method), s, ring);
}

TEST(SimTraining, ModelsAndMethodsParseAndBadOnesAreNamed) {
  EXPECT_EQ(sim::parse_model("mnist").parameters(), 784u * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
  EXPECT_EQ(sim::parse_model("gpt2-small").parameters(), 124439808u);  // GPT-2 small's published count
  const sim::TrainingModel m = sim::parse_model("3x4,5");
  ASSERT_EQ(m.layers.size(), 2u);
  EXPECT_EQ(m.layers[0].rows, 3u);
  EXPECT_EQ(m.layers[1].cols, 5u);
  for (const char* bad : {"", "3x", "x4", "0", "3x4,,5", "resnet"})
    EXPECT_THROW(sim::parse_model(bad), hopwise::InvalidArgument) << bad;

  EXPECT_EQ(sim::parse_method("sync/int8").codec, "int8");
  const sim::TrainingMethod a = sim::parse_method("async:period=8,delay=2,codec=fp16");
  EXPECT_EQ(a.kind, sim::TrainingMethod::Kind::kAsync);
  EXPECT_EQ(a.period, 8);
  EXPECT_EQ(a.delay, 2);
  EXPECT_EQ(a.codec, "fp16");
  EXPECT_EQ(sim::parse_method("async:period=8").delay, 8);
  EXPECT_TRUE(sim::parse_method("ddp").ddp);
  const sim::TrainingMethod g = sim::parse_method("gossip:peers=2,codec=int8");
  EXPECT_EQ(g.kind, sim::TrainingMethod::Kind::kGossip);
  EXPECT_EQ(g.peers, 2);
  EXPECT_EQ(g.codec, "int8");
  const sim::TrainingMethod h = sim::parse_method("hier:period=4");
  EXPECT_EQ(h.kind, sim::TrainingMethod::Kind::kHier);
  EXPECT_EQ(h.period, 4);
  try {
    sim::parse_method("nosuchmethod:period=4");
    ADD_FAILURE() << "an unknown method was taken";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("nosuchmethod"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sim::parse_method("local:period=4/int8"), hopwise::InvalidArgument);
  EXPECT_THROW(sim::parse_method("sync/nosuchcodec"), hopwise::InvalidArgument);
  EXPECT_THROW(sim::parse_method("sync/powersgd:rank=0"), hopwise::InvalidArgument);
}

// Two 1 MiB gradients, a bucket each. With a long backward the first bucket's allreduce hides under it and only
// the last one's shows; with none, the two run back to back.
TEST(SimTraining, SyncHidesWhatBackwardOverlapsAndExposesTheRest) {
  load();
  const Job j = job(4, 2);
  const double t = lone_allreduce(j, 262144);
  const sim::StepResult hidden = step(j, "262144,262144", "sync", 1.0);
  EXPECT_EQ(hidden.buckets, 2);
  EXPECT_NEAR(hidden.step_s(), 1.0 + t, 0.02 * t) << "a lone allreduce takes " << t;
  EXPECT_NEAR(hidden.utilization(), 1.0 / (1.0 + t), 1e-3);
  EXPECT_DOUBLE_EQ(hidden.wire_bytes, 2.0 * 262144 * 4);
  const sim::StepResult bare = step(j, "262144,262144", "sync", 1e-6);
  EXPECT_NEAR(bare.step_s(), 2 * t, 0.05 * t);
  ASSERT_EQ(bare.calls.size(), 1u);
  EXPECT_EQ(bare.calls[0].count, 262144u);
}

// local: H steps of compute, then the model's average; async: the average under D steps of compute.
TEST(SimTraining, LocalAddsTheAverageAndAsyncHidesIt) {
  load();
  const Job j = job(4, 2);
  const double t = lone_allreduce(j, 524288);
  const sim::StepResult local = step(j, "262144,262144", "local:period=4", 0.1);
  EXPECT_EQ(local.steps, 4);
  EXPECT_NEAR(local.period_s, 0.4 + t, 0.02 * t);
  const sim::StepResult hidden = step(j, "262144,262144", "async:period=4", 0.1);
  ASSERT_LT(t, 0.4);
  EXPECT_NEAR(hidden.period_s, 0.4, 1e-6);
  EXPECT_DOUBLE_EQ(hidden.utilization(), 1.0);
  const sim::StepResult behind = step(j, "262144,262144", "async:period=4,delay=1", t / 2);
  EXPECT_NEAR(behind.period_s, t + 3 * t / 2, 0.02 * t);  // the average outlasts the one step it may take
}

// The simulated seconds of one float32 average of `count` among each host's ranks.
double within_host(const Job& j, std::size_t count) {
  std::vector<float> buf(count);
  return sim::run_ranks(
      j.hosts,
      [&](int, hc::Transport& t) {
        sim::RankCollectives coll(t, j.ring, j.host_of, 256u << 10, true);
        coll.allreduce_within_host(buf.data(), buf.data(), count, DataType::kFloat32, hopwise::ReduceOp::kAvg);
      },
      free_work());
}

// hier: each step's buckets averaged within the host (the loopback, not the wire), the model over the world after H
// steps: with no compute, 4 steps of two host averages and one world average; its wire is the world's average alone.
TEST(SimTraining, HierAveragesWithinEachHostEveryStepAndOverTheWorldEveryPeriod) {
  load();
  const Job j = job(8, 4);  // two ranks a host
  const double host = within_host(j, 262144), world = lone_allreduce(j, 524288);
  ASSERT_GT(host, 0);
  ASSERT_LT(host, world / 2) << "a host's loopback against 1 Gbit/s links";
  const sim::StepResult bare = step(j, "262144,262144", "hier:period=4", 1e-6);
  EXPECT_EQ(bare.steps, 4);
  EXPECT_DOUBLE_EQ(bare.wire_bytes, 524288.0 * 4);
  EXPECT_NEAR(bare.period_s, 4 * 2 * host + world, 0.05 * (8 * host + world));
  const sim::StepResult hidden = step(j, "262144,262144", "hier:period=4", 1.0);
  EXPECT_NEAR(hidden.period_s, 4 * (1.0 + host) + world, 0.05 * (4 * host + world));  // the last bucket shows
}

// gossip: the model to one partner and back while the step computes: hidden under a long step, the exchange's
// time under none (one message each way over a host's link: the planned ring's partner of rank 0 is on another
// host here); its wire is the model a partner.
TEST(SimTraining, GossipExchangesWithItsPartnersUnderTheStep) {
  load();
  const Job j = job(4, 4);  // a rank a host: every partner across the 1 Gbit/s network
  const sim::StepResult hidden = step(j, "262144,262144", "gossip:peers=1", 1.0);
  EXPECT_NEAR(hidden.period_s, 1.0, 1e-6);
  EXPECT_DOUBLE_EQ(hidden.wire_bytes, 524288.0 * 4);
  const sim::StepResult bare = step(j, "262144,262144", "gossip:peers=1", 1e-6);
  const double wire_s = 524288.0 * 4 / 125e6;  // 2 MiB at 1 Gbit/s, each direction on its own
  EXPECT_GT(bare.period_s, wire_s);
  EXPECT_LT(bare.period_s, 1.2 * wire_s);
  const sim::StepResult two = step(j, "262144,262144", "gossip:peers=2", 1e-6);
  EXPECT_DOUBLE_EQ(two.wire_bytes, 2 * 524288.0 * 4);
  EXPECT_GT(two.period_s, 1.5 * bare.period_s);  // two partners share the rank's link
}

// int8 moves a byte a float (and the scales it agrees on): at a quarter of the bytes the step is shorter; ddp's
// rank-order ring crosses hosts at every hop where the planned one crosses twice.
TEST(SimTraining, ACodecMovesItsPayloadAndDdpTakesTheRankOrderRing) {
  load();
  const Job j = job(4, 2);
  const sim::StepResult plain = step(j, "1048576", "sync", 1e-6, 25);
  const sim::StepResult int8 = step(j, "1048576", "sync/int8", 1e-6, 25);
  const auto codec = hopwise::compression::make_codec("int8");
  EXPECT_DOUBLE_EQ(int8.wire_bytes,
                   static_cast<double>(codec->payload_bytes(1048576) + codec->scale_count(1048576) * sizeof(float)));
  EXPECT_LT(int8.step_s(), 0.5 * plain.step_s());
  bool payload_call = false;
  for (const sim::StepCall& c : int8.calls)
    payload_call |= c.count == codec->payload_count(1048576) && c.dtype == codec->payload_dtype();
  EXPECT_TRUE(payload_call);
  const sim::StepResult ddp = step(j, "1048576", "ddp", 1e-6, 25);
  EXPECT_GT(ddp.step_s(), 1.5 * plain.step_s()) << "ddp " << ddp.step_s() << " s, planned " << plain.step_s();
  const sim::StepResult powersgd = step(j, "1024x1024", "sync/powersgd:rank=4", 1e-6, 25);
  EXPECT_DOUBLE_EQ(powersgd.wire_bytes, 2.0 * 1024 * 4 * 4);  // P and Q: 1024 x 4 floats each
}

TEST(SimTraining, CodecCostsAreMeasuredFromTheRealCodecs) {
  const sim::CodecCosts none = sim::measure_codec_costs("none");
  EXPECT_EQ(none.encode_s + none.decode_s + none.p_s, 0.0);
  const sim::CodecCosts int8 = sim::measure_codec_costs("int8");
  EXPECT_GT(int8.encode_s, 0.0);
  EXPECT_GT(int8.decode_s, 0.0);
  const sim::CodecCosts ps = sim::measure_codec_costs("powersgd:rank=4");
  EXPECT_GT(ps.p_s, 0.0);
  EXPECT_GT(ps.q_s, 0.0);
  EXPECT_GT(ps.decompress_s, 0.0);
  const sim::CodecCosts given = sim::codec_costs_at("int8", 400e9);
  EXPECT_DOUBLE_EQ(given.encode_s, 4 / 400e9);
}

}  // namespace

// The job's Tuner (comm/src/tuner) on simulated ranks: every rank decides the same choice after the same calls, the
// decision is the one its figures name (the fastest in a row where confirmation blocks ran, else the fastest
// lined-up median), and messages without bytes (the agreements' values beside them) decide exactly as with bytes.
TEST(SimTuner, TheJobsTunerDecidesAlikeWithAndWithoutPayloads) {
  load();
  const Job j = job(8, 4);
  const std::vector<hc::TuningChoice> candidates{{hc::Algorithm::kRing},
                                                 {hc::Algorithm::kTree},
                                                 {hc::Algorithm::kHalvingDoubling},
                                                 {hc::Algorithm::kRing, 1u << 20}};
  std::vector<sim::TunerRun> runs;
  for (bool real : {false, true}) {
    sim::TunerJob t;
    t.hosts = j.hosts;
    t.ring = j.ring;
    t.host_of = j.host_of;
    t.chunk_bytes = 256u << 10;
    t.run.real_payloads = real;
    runs.push_back(sim::tune_in_simulation(t, hc::Collective::kAllreduce, DataType::kFloat32, 1u << 20, candidates));
  }
  for (const sim::TunerRun& r : runs) {
    EXPECT_NE(std::find(candidates.begin(), candidates.end(), r.choice), candidates.end());
    EXPECT_GE(r.calls, static_cast<int>(candidates.size()));
    ASSERT_FALSE(r.ranked.empty());
    EXPECT_GT(r.tuning_s, 0);
    const auto& by = r.in_a_row.empty() ? r.ranked : r.in_a_row;
    const auto fastest = std::min_element(by.begin(), by.end(), [](auto& a, auto& b) { return a.second < b.second; });
    EXPECT_EQ(hc::to_string(fastest->first), hc::to_string(r.choice));
    EXPECT_EQ(r.stats.agreements > 0, true);
  }
  EXPECT_EQ(hc::to_string(runs[0].choice), hc::to_string(runs[1].choice));
  EXPECT_EQ(runs[0].calls, runs[1].calls);
  EXPECT_NEAR(runs[0].tuning_s, runs[1].tuning_s, 1e-9 * runs[1].tuning_s);
  // No candidate to try is refused by name.
  sim::TunerJob t;
  t.hosts = j.hosts;
  t.ring = j.ring;
  t.host_of = j.host_of;
  EXPECT_THROW(sim::tune_in_simulation(t, hc::Collective::kAllreduce, DataType::kFloat32, 64, {}),
               hopwise::InvalidArgument);
}
