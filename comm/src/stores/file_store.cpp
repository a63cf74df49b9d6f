// FileStore: key k is the file "k-<hex of k>" (any bytes make a safe name), written as "tmp-<host>-<random>"
// (mkstemp: created with O_EXCL, so writers in other pid namespaces or on other hosts never share one) and renamed
// into place. Waits poll the files, backing off from 50 us to 5 ms. The claim is the file "job": the job's name,
// the attempt and the claiming process (a random id, its pid and host), one per line.
#include "hopwise/comm/stores/file_store.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "hopwise/common/error.h"
#include "store_protocol.h"

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

std::string host_name() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// This process's claims: the same in every FileStore it makes, different in every other process (a forked child
// included, which inherits the parent's memory).
std::string claim_id() {
  static std::mutex m;
  static pid_t owner = -1;
  static std::string id;
  std::lock_guard lock(m);
  if (owner != ::getpid()) {
    std::random_device rd;
    owner = ::getpid();
    id = fmt::format("{:08x}{:08x} pid {} host {}", rd(), rd(), owner, host_name());
  }
  return id;
}

struct Record {
  std::string job, claim;
  int attempt = 0;
};

Record parse_record(const std::string& text) {
  Record r;
  std::istringstream in(text);
  std::getline(in, r.job);
  std::string line;
  if (std::getline(in, line) && line.rfind("attempt ", 0) == 0) {
    const auto a = store_protocol::parse_integer(line.substr(8));
    r.attempt = a && *a >= 0 && *a < (1 << 30) ? static_cast<int>(*a) : -1;
  }
  if (std::getline(in, line) && line.rfind("claim ", 0) == 0) r.claim = line.substr(6);
  return r;
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

bool holds_keys(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("k-", 0) == 0) return true;
  return false;
}

}  // namespace

FileStore::FileStore(std::string dir, bool claim, std::string job, Seconds timeout, int attempt)
    : dir_(std::move(dir)) {
  const std::string job_file = dir_ + "/job";
  if (job.find('\n') != std::string::npos)
    throw InvalidArgument(fmt::format("store: a job name may not hold a line break ('{}')", job));
  if (claim) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw InvalidArgument(fmt::format("store: cannot create directory '{}': {}", dir_, ec.message()));
    if (exists(job_file)) {
      const Record old = parse_record(read_file(job_file));
      if (old.job != job)
        throw Error(
            fmt::format("store: directory '{}' holds the keys of job '{}', not of this job '{}' (a stale "
                        "directory of an earlier run?): remove it or use a new directory",
                        dir_, old.job, job));
      if (old.attempt == attempt && old.claim == claim_id()) return;  // this process claimed it already
      if (old.attempt >= attempt)
        throw Error(
            fmt::format("store: stale directory '{}': it holds the keys of an earlier run of job '{}' "
                        "(attempt {}, claimed by {}) that did not end cleanly; remove it or use a new "
                        "directory",
                        dir_, job, old.attempt, old.claim.empty() ? "an unknown process" : old.claim));
      remove_keys();  // an earlier attempt of this job (torchrun restarted it): its keys mean nothing now
    } else if (holds_keys(dir_)) {
      throw Error(
          fmt::format("store: directory '{}' holds keys of no recorded job (stale files?): remove it or use a new "
                      "directory",
                      dir_));
    }
    write_file(job_file, fmt::format("{}\nattempt {}\nclaim {}\n", job, attempt, claim_id()));
    return;
  }
  Record seen;
  const bool ok = poll_until(
      [&] {
        if (!exists(job_file)) return false;
        seen = parse_record(read_file(job_file));
        return seen.job == job && seen.attempt == attempt;
      },
      timeout);
  if (ok) return;
  if (!seen.job.empty() && seen.job != job)
    throw Error(
        fmt::format("store: directory '{}' belongs to job '{}', not to this job '{}' (a stale directory of an "
                    "earlier run?): remove it or use a new directory",
                    dir_, seen.job, job));
  throw TimeoutError(fmt::format("store: directory '{}' was not claimed for attempt {} of job '{}' within {:.1f} s: "
                                 "the claiming rank (rank 0) has not started, or this is not its directory",
                                 dir_, attempt, job, timeout.count()),
                     {0});
}

std::string FileStore::path_of(const std::string& key) const {
  static constexpr char kHex[] = "0123456789abcdef";
  if (key.size() > 120)  // hex doubles it, and a file name may have 255 bytes
    throw InvalidArgument(fmt::format("store '{}': key '{}...' is {} bytes; a file store's key may have at most 120",
                                      dir_, key.substr(0, 40), key.size()));
  std::string name = "k-";
  for (unsigned char c : key) {
    name += kHex[c >> 4];
    name += kHex[c & 15];
  }
  return dir_ + "/" + name;
}

void FileStore::write_file(const std::string& path, const std::string& value) const {
  std::string tmp = fmt::format("{}/tmp-{}-XXXXXX", dir_, host_name());
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw TransportError(fmt::format("store: cannot create a file in '{}': {}", dir_, std::strerror(errno)));
  auto fail = [&](const std::string& what) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw TransportError(fmt::format("store: cannot {} '{}': {}", what, tmp, why));
  };
  if (::fchmod(fd, 0644) != 0) fail("set the mode of");
  for (std::size_t at = 0; at < value.size();) {
    const ssize_t n = ::write(fd, value.data() + at, value.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write");
    at += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw TransportError(fmt::format("store: cannot write '{}': {}", tmp, why));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw TransportError(fmt::format("store: cannot rename '{}' to '{}': {}", tmp, path, why));
  }
}

void FileStore::remove_keys() const {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("k-", 0) == 0 || name.rfind("tmp-", 0) == 0) fs::remove(e.path(), ec);
  }
}

void FileStore::leave(int size) {
  if (add("hopwise/left", 1) < size) return;
  remove_keys();
  std::error_code ec;
  for (const char* name : {"/job", "/lock"}) fs::remove(dir_ + name, ec);
  fs::remove(dir_, ec);  // only when nothing else is in it
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
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
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
    const bool has = exists(path);
    const std::string old = has ? read_file(path) : std::string();
    v = store_protocol::checked_add(key, has ? &old : nullptr, delta, fmt::format("store: file '{}': ", path));
    write_file(path, std::to_string(v));
  } catch (...) {
    ::close(fd);  // releases the lock
    throw;
  }
  ::close(fd);
  return v;
}

}  // namespace hopwise::comm
