// train_mnist's summary lines (examples/train_mnist/report.cpp).
#include <gtest/gtest.h>

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
