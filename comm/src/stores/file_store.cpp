// FileStore: key k is the file "k-<hex of k>" (any bytes make a safe name), written as "tmp-<unique>" and renamed
// into place. Waits poll the files, backing off from 50 us to 5 ms. The job is the file "job".
#include "hopwise/comm/stores/file_store.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Polls `ready` until it holds or `timeout` passes.
template <class F>
bool poll_until(F ready, Store::Seconds timeout) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    if (ready()) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(5));
  }
}

}  // namespace

FileStore::FileStore(std::string dir, bool claim, std::string job, Seconds timeout) : dir_(std::move(dir)) {
  const std::string job_file = dir_ + "/job";
  if (claim) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw InvalidArgument(fmt::format("store: cannot create directory '{}': {}", dir_, ec.message()));
    if (exists(job_file)) {
      const std::string other = read_file(job_file);
      if (other != job)
        throw Error(
            fmt::format("store: directory '{}' holds the keys of job '{}', not of this job '{}' (stale files "
                        "of an earlier run?): remove it or use a new directory",
                        dir_, other, job));
    } else {
      for (const auto& e : fs::directory_iterator(dir_))
        if (e.path().filename().string().rfind("k-", 0) == 0)
          throw Error(
              fmt::format("store: directory '{}' holds keys of no recorded job (stale files?): remove it or "
                          "use a new directory",
                          dir_));
      write_file(job_file, job);
    }
    return;
  }
  std::string seen;
  const bool ok = poll_until(
      [&] {
        if (!exists(job_file)) return false;
        seen = read_file(job_file);
        return seen == job;
      },
      timeout);
  if (ok) return;
  if (!seen.empty())
    throw Error(
        fmt::format("store: directory '{}' belongs to job '{}', not to this job '{}' (stale files of an "
                    "earlier run?): remove it or use a new directory",
                    dir_, seen, job));
  throw TimeoutError(fmt::format("store: directory '{}' was not claimed within {:.1f} s: the claiming rank (rank 0) "
                                 "has not started, or this is not its directory",
                                 dir_, timeout.count()),
                     {0});
}

std::string FileStore::path_of(const std::string& key) const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string name = "k-";
  for (unsigned char c : key) {
    name += kHex[c >> 4];
    name += kHex[c & 15];
  }
  return dir_ + "/" + name;
}

void FileStore::write_file(const std::string& path, const std::string& value) const {
  static std::atomic<std::uint64_t> counter{0};
  const std::string tmp = fmt::format("{}/tmp-{}-{}", dir_, ::getpid(), counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!f) throw TransportError(fmt::format("store: cannot write '{}': {}", tmp, std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw TransportError(fmt::format("store: cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
}

void FileStore::set(const std::string& key, const std::string& value) { write_file(path_of(key), value); }

std::string FileStore::get(const std::string& key, Seconds timeout) {
  wait({key}, timeout);
  return read_file(path_of(key));
}

void FileStore::wait(const std::vector<std::string>& keys, Seconds timeout) {
  std::size_t next = 0;  // keys appear in any order; those found stay found
  if (poll_until(
          [&] {
            while (next < keys.size() && exists(path_of(keys[next]))) ++next;
            return next == keys.size();
          },
          timeout))
    return;
  throw TimeoutError(fmt::format("store '{}': key '{}' not set within {:.1f} s; a rank that should set it has not "
                                 "arrived (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                 dir_, keys[next], timeout.count()),
                     {});
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys)
    if (!exists(path_of(k))) return false;
  return true;
}

// Read, add, write under an exclusive lock on "<dir>/lock": an fcntl lock across processes (and hosts that share
// the file system's locking), and a mutex among this process's threads, which fcntl locks do not keep apart.
std::int64_t FileStore::add(const std::string& key, std::int64_t delta) {
  static std::mutex threads;
  std::lock_guard process_lock(threads);
  const std::string lock_path = dir_ + "/lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd < 0) throw TransportError(fmt::format("store: cannot open '{}': {}", lock_path, std::strerror(errno)));
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_SETLKW, &fl) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw TransportError(fmt::format("store: cannot lock '{}': {}", lock_path, why));
  }
  std::int64_t v = 0;
  try {
    const std::string path = path_of(key);
    const std::string old = exists(path) ? read_file(path) : std::string();
    v = (old.empty() ? 0 : std::stoll(old)) + delta;
    write_file(path, std::to_string(v));
  } catch (...) {
    ::close(fd);  // releases the lock
    throw;
  }
  ::close(fd);
  return v;
}

}  // namespace hopwise::comm
