// The averaging problem (averaging_problem.h) run on in-process ranks, for the gtest suites that check the methods.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "averaging_problem.h"
#include "inproc_group.h"

namespace hwtest::averaging {

// Every rank's final parameters; a rank's error fails the calling test, naming the spec.
inline Models train(hwtest::Group& g, const Run& run) {
  Models out(static_cast<std::size_t>(g.size()));
  const std::string err = g.run(
      [&](int r, hopwise::comm::Communicator& comm) { out[static_cast<std::size_t>(r)] = train_rank(r, comm, run); });
  EXPECT_EQ(err, "") << run.spec;
  return out;
}

}  // namespace hwtest::averaging
