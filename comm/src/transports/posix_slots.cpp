#include "posix_slots.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

std::string segment_name(int rank) {
  static std::atomic<int> n{0};
  return fmt::format("/hopwise-slots-{}-{}-{}", ::getpid(), rank, n++);
}

char* map_segment(const std::string& name, std::size_t bytes, bool create) {
  const int fd =
      create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0)
    throw TransportError(
        fmt::format("shm_open({}) failed: {}; is /dev/shm mounted and writable?", name, std::strerror(errno)));
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw TransportError(
        fmt::format("ftruncate({}, {} bytes) failed: {}; /dev/shm may be full", name, bytes, std::strerror(e)));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    if (create) ::shm_unlink(name.c_str());
    throw TransportError(fmt::format("mmap of {} ({} bytes) failed: {}", name, bytes, std::strerror(e)));
  }
  return static_cast<char*>(p);
}

}  // namespace

PosixSlots::PosixSlots(Store& store, const std::string& name, int rank, int size, std::size_t slot_bytes,
                       Store::Seconds timeout) {
  const std::size_t bytes = SharedSlots::slot_size(slot_bytes);
  const std::string mine = segment_name(rank);
  char* own = map_segment(mine, bytes, true);
  std::memset(own, 0, bytes);  // flags start at 0; pages touched now
  std::vector<std::string> names;
  try {
    names = store_allgather(store, name + "/names", rank, size, mine, timeout);
    slots_.base.assign(static_cast<std::size_t>(size), nullptr);
    lengths_.assign(static_cast<std::size_t>(size), 0);
    for (int r = 0; r < size; ++r) {
      const auto i = static_cast<std::size_t>(r);
      slots_.base[i] = r == rank ? own : map_segment(names[i], bytes, false);
      lengths_[i] = bytes;
    }
    store_allgather(store, name + "/mapped", rank, size, "", timeout);
  } catch (...) {
    ::shm_unlink(mine.c_str());
    for (std::size_t i = 0; i < slots_.base.size(); ++i)
      if (slots_.base[i] && slots_.base[i] != own) ::munmap(slots_.base[i], lengths_[i]);
    ::munmap(own, bytes);
    throw;
  }
  ::shm_unlink(mine.c_str());  // every rank has it mapped: the name is no longer needed
  slots_.slot_bytes = slot_bytes;
}

PosixSlots::~PosixSlots() {
  for (std::size_t i = 0; i < slots_.base.size(); ++i)
    if (slots_.base[i]) ::munmap(slots_.base[i], lengths_[i]);
}

}  // namespace hopwise::comm
