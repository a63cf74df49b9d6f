// Scratch buffers that live as long as the communicator: grown on demand, pre-touched, never freed per call.
// A page fault costs ~12 us per 4 KiB page on these machines, so allocating a temporary per collective would
// cost more than the collective itself at large sizes.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <vector>

namespace hopwise::comm {

enum class Scratch : int { kRecvA = 0, kRecvB, kWork, kTree, kPayload, kGathered, kCount };

class Workspace {
 public:
  // A buffer of at least `bytes` for `slot`, 64-byte aligned. Earlier pointers of that slot become invalid.
  void* get(Scratch slot, std::size_t bytes);
  std::size_t total_bytes() const;
  // For scratch shared by simulated ranks (one OS thread, their buffers holding nothing): a slot that grows keeps
  // its outgrown buffer until the Workspace goes (a rank between two calls of get may still use the old one), and
  // new pages are not touched (the simulation never writes most of them).
  void share_between_simulated_ranks() { shared_ = true; }

 private:
  struct Block {
    void operator()(void* p) const { std::free(p); }
  };
  bool shared_ = false;
  std::vector<std::unique_ptr<void, Block>> outgrown_;
  std::unique_ptr<void, Block> buf_[static_cast<int>(Scratch::kCount)];
  std::size_t size_[static_cast<int>(Scratch::kCount)] = {};
};

}  // namespace hopwise::comm
