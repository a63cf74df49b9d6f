// train_mnist's summary lines and --json (examples/train_mnist/report.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "report.h"

namespace hc = hopwise::comm;

namespace {
hc::TuningEntry entry(int size_class, hc::Algorithm a) {
  hc::TuningEntry e;
  e.size_class = size_class;
  e.choice.algorithm = a;
  return e;
}
}  // namespace

// The tuner keeps its classes in the order it met them (the demo printed "65536 B one_shot, 1048576 B one_shot,
// 8192 B native"); the line lists the buckets' classes by size, leaving out the small bookkeeping calls.
TEST(TrainMnistReport, TunedClassesAreListedBySize) {
  const std::vector<hc::TuningEntry> entries{entry(16, hc::Algorithm::kOneShot), entry(20, hc::Algorithm::kRing),
                                             entry(3, hc::Algorithm::kNative), entry(13, hc::Algorithm::kNative)};
  EXPECT_EQ(hopwise::examples::describe_tuned(entries), "8192 B native, 65536 B one_shot, 1048576 B ring");
  EXPECT_EQ(hopwise::examples::describe_tuned({entry(2, hc::Algorithm::kRing)}), "");
}

// An averaging method's line: its syncs, with their all-reduces' time and the part compute hid, only where it made
// any (gossip makes none), and the state it keeps always.
TEST(TrainMnistReport, AveragingLineNamesSyncsHiddenTimeAndState) {
  hc::AveragingStats st;
  st.averages = 26;
  st.bytes = 26u * 400000u;
  st.syncs = 25;
  st.comm_ms = 50;
  st.hidden_ms = 40;
  st.state_bytes = 3200000;
  EXPECT_EQ(hopwise::examples::describe_averaging("diloco:period=8,fragments=2", st, 100, 0.5),
            "averaging diloco:period=8,fragments=2: 26 averagings, 0.10 MB of parameters per step, 0.50 ms a step "
            "waiting on them; 25 syncs, their all-reduces 0.50 ms a step, 0.40 ms of it hidden behind compute; "
            "3.20 MB of state beside the model");
  st.syncs = 0;
  st.state_bytes = 0;
  EXPECT_EQ(hopwise::examples::describe_averaging("gossip:peers=1", st, 0, 0),
            "averaging gossip:peers=1: 26 averagings, 10.40 MB of parameters per step, 0.00 ms a step waiting on "
            "them; 0.00 MB of state beside the model");
}

// --json carries the averager's stats beside the other averaging figures.
TEST(TrainMnistReport, JsonCarriesTheAveragersStats) {
  hopwise::examples::Summary s;
  s.averaging_syncs = 25;
  s.averaging_comm_ms = 0.5;
  s.averaging_hidden_ms = 0.4;
  s.averaging_state_bytes = 3200000;
  const std::string path = ::testing::TempDir() + "train_mnist_report.json";
  hopwise::examples::write_json(path, s);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* field : {"\"averaging_syncs\": 25,", "\"averaging_comm_ms\": 0.500,",
                            "\"averaging_hidden_ms\": 0.400,", "\"averaging_state_bytes\": 3200000,"})
    EXPECT_NE(text.find(field), std::string::npos) << field << " not in " << text;
  std::remove(path.c_str());
}
