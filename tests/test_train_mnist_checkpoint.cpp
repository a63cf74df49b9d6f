// train_mnist's checkpoint header parser (examples/train_mnist/checkpoint.cpp): what save_checkpoint writes reads
// back, and a header with a count out of range, a sign, a space too many or no end is not a checkpoint of ours.
#include <gtest/gtest.h>

#include <string>

#include "checkpoint.h"

namespace {

using hopwise::examples::Checkpoint;
using hopwise::examples::checkpoint_header_text;
using hopwise::examples::kMaxCheckpointHeader;
using hopwise::examples::kMaxCheckpointSteps;
using hopwise::examples::parse_checkpoint_header;

const std::string kFirst = "hopwise-train_mnist-checkpoint 2\n";

// A header whose second line is `counts`, averaging state "hopwise-averaging 1 sync 20".
std::string header(const std::string& counts) { return kFirst + counts + "\nhopwise-averaging 1 sync 20\n"; }

TEST(CheckpointHeader, WhatSaveWritesReadsBack) {
  const Checkpoint c{40, 2, 128, 0xfedcba9876543210ULL, "hopwise-averaging 1 local:period=3 40"};
  const std::string text = checkpoint_header_text(c, 1863690);
  const auto h = parse_checkpoint_header(text + std::string(64, '\xff'));  // the parameters follow
  ASSERT_TRUE(h);
  EXPECT_EQ(h->c.steps_done, 40);
  EXPECT_EQ(h->c.ranks, 2);
  EXPECT_EQ(h->c.batch, 128);
  EXPECT_EQ(h->c.run, 0xfedcba9876543210ULL);
  EXPECT_EQ(h->c.averaging, c.averaging);
  EXPECT_EQ(h->count, 1863690u);
  EXPECT_EQ(h->length, text.size());
  EXPECT_EQ(h->file_size(), text.size() + 2 * 1863690 * sizeof(float));
}

// Once trusted: 0 steps trained (50*(2^32-3)) or ~2^31 empty epochs (50*2^31, 9.2e18).
TEST(CheckpointHeader, RefusesStepCountsOutOfRange) {
  for (const char* steps : {"214748364650", "107374182400", "9200000000000000000", "99999999999999999999", "-1"})
    EXPECT_FALSE(parse_checkpoint_header(header(std::string(steps) + " 2 128 7 100"))) << steps;
  EXPECT_TRUE(parse_checkpoint_header(header(std::to_string(kMaxCheckpointSteps) + " 2 128 7 100")));
  EXPECT_FALSE(parse_checkpoint_header(header(std::to_string(kMaxCheckpointSteps + 1) + " 2 128 7 100")));
}

TEST(CheckpointHeader, RefusesOtherCountsOutOfRange) {
  for (const char* counts :
       {"20 0 128 7 100", "20 -2 128 7 100", "20 2147483648 128 7 100", "20 2 0 7 100", "20 2 4294967424 7 100",
        "20 2 128 -7 100", "20 2 128 18446744073709551616 100", "20 2 128 7 0", "20 2 128 7 68719476737"})
    EXPECT_FALSE(parse_checkpoint_header(header(counts))) << counts;
}

TEST(CheckpointHeader, RefusesWhatSaveNeverWrites) {
  for (const char* counts : {"+20 2 128 7 100", " 20 2 128 7 100", "20  2 128 7 100", "20 2 128 7 100 ", "20 2 128 7",
                             "20 2 128 7 100 5", "0x14 2 128 7 100", "20 2 128 7 1e3", ""})
    EXPECT_FALSE(parse_checkpoint_header(header(counts))) << counts;
  EXPECT_FALSE(parse_checkpoint_header("hopwise-train_mnist-checkpoint 1\n20 2 128 7 100\nx\n"));  // another version
  EXPECT_FALSE(parse_checkpoint_header("something else 2\n20 2 128 7 100\nx\n"));
  EXPECT_FALSE(parse_checkpoint_header(kFirst + "20 2 128 7 100\nno end of line"));
  EXPECT_FALSE(parse_checkpoint_header(""));
}

// The averaging line ends within kMaxCheckpointHeader bytes, or the header is not ours (a read stops there).
TEST(CheckpointHeader, EndsWithinTheCap) {
  const std::string start = kFirst + "20 2 128 7 100\n";
  const std::string fits(kMaxCheckpointHeader - start.size() - 1, 'a');
  EXPECT_TRUE(parse_checkpoint_header(start + fits + "\n"));
  EXPECT_FALSE(parse_checkpoint_header(start + fits + "a\n"));
}

}  // namespace
