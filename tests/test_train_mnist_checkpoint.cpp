// train_mnist's checkpoint header parser (examples/train_mnist/checkpoint.cpp): what save_checkpoint writes reads
// back, and a header with a count out of range (the averaging state's bytes past the model's bound among them), a
// sign, a space too many or no end is not a checkpoint of ours.
#include <gtest/gtest.h>

#include <string>

#include "checkpoint.h"

namespace {

using hopwise::examples::Checkpoint;
using hopwise::examples::checkpoint_header_text;
using hopwise::examples::kMaxCheckpointHeader;
using hopwise::examples::kMaxCheckpointSteps;
using hopwise::examples::max_averaging_bytes;
using hopwise::examples::parse_checkpoint_header;

const std::string kFirst = "hopwise-train_mnist-checkpoint 3\n";

// A header whose second line is `counts` (the parameters follow: a header never needs them to end).
std::string header(const std::string& counts) { return kFirst + counts + "\n" + std::string(16, '\n'); }

TEST(CheckpointHeader, WhatSaveWritesReadsBack) {
  // The averaging state is binary (newlines, NULs): it is not in the header, only its length.
  const Checkpoint c{40, 2, 128, 0xfedcba9876543210ULL, std::string("hopwise-averaging 2 diloco 40 3\n\0\n\xff", 35)};
  const std::string text = checkpoint_header_text(c, 1863690, c.averaging.size());
  EXPECT_EQ(text, kFirst + "40 2 128 18364758544493064720 1863690 35\n");
  const auto h = parse_checkpoint_header(text + std::string(64, '\xff'));  // the parameters follow
  ASSERT_TRUE(h);
  EXPECT_EQ(h->c.steps_done, 40);
  EXPECT_EQ(h->c.ranks, 2);
  EXPECT_EQ(h->c.batch, 128);
  EXPECT_EQ(h->c.run, 0xfedcba9876543210ULL);
  EXPECT_EQ(h->c.averaging, "");  // read from after the momentum
  EXPECT_EQ(h->count, 1863690u);
  EXPECT_EQ(h->averaging_bytes, 35u);
  EXPECT_EQ(h->length, text.size());
  EXPECT_EQ(h->file_size(), text.size() + 2 * 1863690 * sizeof(float) + 35);
}

// diloco's state runs to megabytes: any size up to the model's bound, none past it (a resume allocates it).
TEST(CheckpointHeader, AveragingBytesAreBoundedByTheModel) {
  EXPECT_EQ(max_averaging_bytes(100), 8 * 100 * 4 + (1u << 20));
  for (const std::uint64_t bytes : {std::uint64_t{0}, std::uint64_t{30}, max_averaging_bytes(100)})
    EXPECT_TRUE(parse_checkpoint_header(header("20 2 128 7 100 " + std::to_string(bytes)))) << bytes;
  for (const std::string& bytes : {std::to_string(max_averaging_bytes(100) + 1), std::string("18446744073709551615"),
                                   std::string("18446744073709551616"), std::string("-1")})
    EXPECT_FALSE(parse_checkpoint_header(header("20 2 128 7 100 " + bytes))) << bytes;
  // The bound follows the model's size, the largest model's too.
  const std::string most = std::to_string(hopwise::examples::kMaxCheckpointCount);
  EXPECT_TRUE(parse_checkpoint_header(header(
      "20 2 128 7 " + most + " " + std::to_string(max_averaging_bytes(hopwise::examples::kMaxCheckpointCount)))));
}

// Once trusted: 0 steps trained (50*(2^32-3)) or ~2^31 empty epochs (50*2^31, 9.2e18).
TEST(CheckpointHeader, RefusesStepCountsOutOfRange) {
  for (const char* steps : {"214748364650", "107374182400", "9200000000000000000", "99999999999999999999", "-1"})
    EXPECT_FALSE(parse_checkpoint_header(header(std::string(steps) + " 2 128 7 100 30"))) << steps;
  EXPECT_TRUE(parse_checkpoint_header(header(std::to_string(kMaxCheckpointSteps) + " 2 128 7 100 30")));
  EXPECT_FALSE(parse_checkpoint_header(header(std::to_string(kMaxCheckpointSteps + 1) + " 2 128 7 100 30")));
}

TEST(CheckpointHeader, RefusesOtherCountsOutOfRange) {
  for (const char* counts : {"20 0 128 7 100 30", "20 -2 128 7 100 30", "20 2147483648 128 7 100 30", "20 2 0 7 100 30",
                             "20 2 4294967424 7 100 30", "20 2 128 -7 100 30", "20 2 128 18446744073709551616 100 30",
                             "20 2 128 7 0 30", "20 2 128 7 68719476737 30"})
    EXPECT_FALSE(parse_checkpoint_header(header(counts))) << counts;
}

TEST(CheckpointHeader, RefusesWhatSaveNeverWrites) {
  for (const char* counts : {"+20 2 128 7 100 30", " 20 2 128 7 100 30", "20  2 128 7 100 30", "20 2 128 7 100 30 ",
                             "20 2 128 7 100", "20 2 128 7 100 30 5", "0x14 2 128 7 100 30", "20 2 128 7 1e3 30",
                             "20 2 128 7 100 +30", "20 2 128 7 100 0x1e", ""})
    EXPECT_FALSE(parse_checkpoint_header(header(counts))) << counts;
  // Version 2 held the averaging state as a third line: not this layout.
  EXPECT_FALSE(
      parse_checkpoint_header("hopwise-train_mnist-checkpoint 2\n20 2 128 7 100\nhopwise-averaging 1 sync 20\n"));
  EXPECT_FALSE(parse_checkpoint_header("hopwise-train_mnist-checkpoint 1\n20 2 128 7 100\nx\n"));  // another version
  EXPECT_FALSE(parse_checkpoint_header("something else 3\n20 2 128 7 100 30\n"));
  EXPECT_FALSE(parse_checkpoint_header(kFirst + "20 2 128 7 100 30"));  // no end of line
  EXPECT_FALSE(parse_checkpoint_header(""));
}

// The header ends within kMaxCheckpointHeader bytes, or it is not ours (a read stops there): leading zeros, which
// save never writes but the parser takes, cannot stretch it past.
TEST(CheckpointHeader, EndsWithinTheCap) {
  const std::string start = kFirst + "20 2 128 7 100 ";
  const std::string fits(kMaxCheckpointHeader - start.size() - 3, '0');
  EXPECT_TRUE(parse_checkpoint_header(start + fits + "30\n"));
  EXPECT_FALSE(parse_checkpoint_header(start + fits + "030\n"));
}

}  // namespace
