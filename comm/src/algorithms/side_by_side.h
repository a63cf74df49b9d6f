// How an algorithm runs parts of one call side by side (hier's pipeline: the host's reduce, the leaders' ring and
// the host's broadcast at once, segment by segment) and how the parts wait for each other. A job runs them on OS
// threads with a mutex and a condition variable; a simulation, whose ranks are actors sharing one OS thread that
// must never block in an OS wait, swaps in its own (actors of the rank's host and SimGrid's condition variables)
// through set_side_by_side, as it swaps in the element-wise work's hook.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace hopwise::comm::algo {

// Counters of how far each part has come, shared by the parts; a failed part wakes the others.
class PartProgress {
 public:
  virtual ~PartProgress() = default;
  virtual void advance(int counter) = 0;
  // Waits until `counter` passes `value`; false if a part failed.
  virtual bool wait_past(int counter, std::size_t value) = 0;
  virtual void fail() = 0;
  virtual bool failed() = 0;
};

class SideBySide {
 public:
  virtual ~SideBySide() = default;
  // Runs every part at once, parts[0] on the caller's thread, and returns once all have. A part must not throw
  // (catch inside and fail the progress).
  virtual void run(const std::vector<std::function<void()>>& parts) = 0;
  virtual std::unique_ptr<PartProgress> progress(int counters) = 0;
};

// This thread's way (OS threads unless a simulation set its own).
SideBySide& side_by_side();
// nullptr: OS threads again. Per OS thread, as the work hook.
void set_side_by_side(SideBySide* way);

}  // namespace hopwise::comm::algo
