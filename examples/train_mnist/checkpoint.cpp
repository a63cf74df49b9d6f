#include "checkpoint.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "hopwise/common/error.h"

namespace hopwise::examples {

namespace {

constexpr const char* kMagic = "hopwise-train_mnist-checkpoint";

// Each rank's `mine`, in rank order.
std::vector<std::int32_t> gather(comm::Communicator& comm, std::int32_t mine) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(&mine, all.data(), 1, DataType::kInt32);
  return all;
}

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  for (std::size_t at = 0; at < n;) {
    const ssize_t w = ::write(fd, p + at, n - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(fmt::format("writing the checkpoint {} failed: {}", path, std::strerror(errno)));
    at += static_cast<std::size_t>(w);
  }
}

void sync_directory_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::filesystem::path dir = parent.empty() ? std::filesystem::current_path() : parent;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // some file systems cannot open a directory; the rename stands
  ::fsync(fd);
  ::close(fd);
}

Checkpoint read_own(const std::string& path, float* params, float* velocity, std::size_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("--resume: cannot read {} (each rank reads its own PATH.rankR)", path));
  std::string magic, line;
  int version = 0;
  std::size_t n = 0;
  Checkpoint c;
  in >> magic >> version >> c.epochs_done >> c.ranks >> n;
  std::getline(in, line);
  std::getline(in, c.averaging);
  if (!in || magic != kMagic || version != 1 || c.epochs_done < 0)
    throw InvalidArgument(fmt::format("--resume: {} is not a train_mnist checkpoint", path));
  if (n != count)
    throw InvalidArgument(
        fmt::format("--resume: {} holds {} parameters, this model has {}; resume with the same "
                    "--hidden",
                    path, n, count));
  in.read(reinterpret_cast<char*>(params), static_cast<std::streamsize>(count * sizeof(float)));
  in.read(reinterpret_cast<char*>(velocity), static_cast<std::streamsize>(count * sizeof(float)));
  if (!in) throw InvalidArgument(fmt::format("--resume: {} is cut short", path));
  return c;
}

std::string ranks_where(const std::vector<std::int32_t>& v, bool (*pick)(std::int32_t, std::int32_t),
                        std::int32_t ref) {
  std::string s;
  for (std::size_t r = 0; r < v.size(); ++r)
    if (pick(v[r], ref)) s += fmt::format("{}{}", s.empty() ? "" : ", ", r);
  return s;
}

}  // namespace

std::string checkpoint_path(const std::string& base, int rank) { return fmt::format("{}.rank{}", base, rank); }

void save_checkpoint(comm::Communicator& comm, const std::string& base, const Checkpoint& c, const float* params,
                     const float* velocity, std::size_t count) {
  const std::string path = checkpoint_path(base, comm.rank()), tmp = path + ".tmp";
  std::string failure;
  try {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(fmt::format("cannot write the checkpoint {}: {}", tmp, std::strerror(errno)));
    try {
      const std::string head = fmt::format("{} 1\n{} {} {}\n{}\n", kMagic, c.epochs_done, c.ranks, count, c.averaging);
      write_all(fd, head.data(), head.size(), tmp);
      write_all(fd, params, count * sizeof(float), tmp);
      write_all(fd, velocity, count * sizeof(float), tmp);
      if (::fsync(fd) != 0) throw Error(fmt::format("syncing the checkpoint {} failed: {}", tmp, std::strerror(errno)));
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw Error(fmt::format("writing the checkpoint {} failed: {}", tmp, std::strerror(errno)));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Rename only once every rank holds its new file whole: a save some rank could not finish leaves the last one.
  const auto ok = gather(comm, failure.empty() ? 1 : 0);
  const std::string failed = ranks_where(
      ok, [](std::int32_t v, std::int32_t) { return v == 0; }, 0);
  if (!failed.empty()) {
    std::remove(tmp.c_str());
    throw Error(
        fmt::format("checkpoint after epoch {} not saved: rank(s) {} could not write theirs{}; the last "
                    "checkpoint stands",
                    c.epochs_done, failed, failure.empty() ? "" : " (here: " + failure + ")"));
  }
  std::filesystem::rename(tmp, path);
  sync_directory_of(path);
}

Checkpoint load_checkpoint(comm::Communicator& comm, const std::string& base, float* params, float* velocity,
                           std::size_t count) {
  const std::string path = checkpoint_path(base, comm.rank());
  Checkpoint c;
  std::string failure;
  try {
    c = read_own(path, params, velocity, count);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Every rank learns what every other found, so that all fail together or none does.
  const auto epochs = gather(comm, failure.empty() ? c.epochs_done : -1);
  const std::string unreadable = ranks_where(
      epochs, [](std::int32_t v, std::int32_t) { return v < 0; }, 0);
  if (!failure.empty()) throw InvalidArgument(failure);
  if (!unreadable.empty())
    throw InvalidArgument(
        fmt::format("--resume {}: rank(s) {} could not read their checkpoint files", base, unreadable));
  const std::string other = ranks_where(
      epochs, [](std::int32_t v, std::int32_t ref) { return v != ref; }, epochs[0]);
  if (!other.empty()) {
    std::string each;
    for (std::size_t r = 0; r < epochs.size(); ++r)
      each += fmt::format("{}rank {}: {}", each.empty() ? "" : ", ", r, epochs[r]);
    throw InvalidArgument(
        fmt::format("--resume {}: the ranks' files are of different epochs ({}); rank(s) {} differ "
                    "from rank 0 (files of different saves mixed?): resume every rank from one save",
                    base, each, other));
  }
  return c;
}

}  // namespace hopwise::examples
