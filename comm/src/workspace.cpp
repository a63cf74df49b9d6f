#include "workspace.h"

#include <cstring>
#include <new>

namespace hopwise::comm {

void* Workspace::get(Scratch slot, std::size_t bytes) {
  const int i = static_cast<int>(slot);
  if (bytes <= size_[i]) return buf_[i].get();
  // Grow geometrically so that a sweep of sizes reallocates O(log) times.
  std::size_t want = std::max<std::size_t>(bytes, size_[i] * 2);
  want = (want + 4095) & ~std::size_t{4095};
  void* p = std::aligned_alloc(4096, want);
  if (p == nullptr) throw std::bad_alloc();
  if (shared_) {
    if (buf_[i]) outgrown_.push_back(std::move(buf_[i]));
  } else {
    std::memset(p, 0, want);  // touch every page now, not inside a timed collective
  }
  buf_[i].reset(p);
  size_[i] = want;
  return p;
}

std::size_t Workspace::total_bytes() const {
  std::size_t t = 0;
  for (std::size_t s : size_) t += s;
  return t;
}

}  // namespace hopwise::comm
