// FileStore: key k is the file "k-<hex of k>" (any bytes make a safe name), written as "tmp-<host>-<random>"
// (created with O_EXCL, so writers in other pid namespaces or on other hosts never share one) and renamed into
// place. Waits poll the files, backing off from 50 us to 5 ms. The claim is the file "job": the job's name, the
// attempt and the claiming process (a random id, its pid and host), one per line.
// Whoever can write the directory could plant a link, a FIFO or a directory where a file goes: the directory is
// opened once and checked (ours, not writable by others unless sticky), and each file is reached by openat on it
// with O_NOFOLLOW, looked at (fstatat) before it is opened and read only if it is a regular file of this user.
#include "hopwise/comm/stores/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "hopwise/common/error.h"
#include "store_protocol.h"

namespace hopwise::comm {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kSafeDir = "mkdir -m 700 DIR makes a safe one";

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The store writes only regular files of its own user: anything else in its place was put there by someone else,
// and following, reading or waiting on it would hand them this rank.
void check_entry(const struct stat& st, const std::string& path) {
  if (!S_ISREG(st.st_mode))
    throw InvalidArgument(
        fmt::format("store: '{}' is {}, not a file the store wrote (it follows no link and reads "
                    "only regular files): remove it (rm -r '{}') or use a new directory ({})",
                    path, kind_of(st.st_mode), path, kSafeDir));
  if (st.st_uid != ::geteuid())
    throw InvalidArgument(
        fmt::format("store: '{}' belongs to user {}, not to this user ({}): another user wrote into "
                    "the store's directory; remove it or use a directory of your own ({})",
                    path, st.st_uid, ::geteuid(), kSafeDir));
}

// Whether the entry `name` is there (a regular file of ours; anything else is refused), without following a link.
bool probe(int dfd, const std::string& dir, const std::string& name) {
  struct stat st;
  if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    throw TransportError(fmt::format("store: cannot look at '{}/{}': {}", dir, name, std::strerror(errno)));
  }
  check_entry(st, dir + "/" + name);
  return true;
}

// The entry opened with `flags` (O_CREAT to make it), or -1 when it is not there. Looked at before it is opened (a
// device is never opened), opened without following a link and without blocking (a FIFO blocks an open), and
// looked at again through the descriptor (it may have been swapped in between).
int open_entry(int dfd, const std::string& dir, const std::string& name, int flags) {
  if (!probe(dfd, dir, name) && !(flags & O_CREAT)) return -1;
  const int fd = ::openat(dfd, name.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT && !(flags & O_CREAT)) return -1;  // removed meanwhile
    probe(dfd, dir, name);                             // names a link or FIFO swapped in since
    throw TransportError(fmt::format("store: cannot open '{}/{}': {}", dir, name, std::strerror(e)));
  }
  struct stat st;
  try {
    if (::fstat(fd, &st) != 0)
      throw TransportError(fmt::format("store: cannot look at '{}/{}': {}", dir, name, std::strerror(errno)));
    check_entry(st, dir + "/" + name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

std::optional<std::string> read_entry(int dfd, const std::string& dir, const std::string& name) {
  const int fd = open_entry(dfd, dir, name, O_RDONLY);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw TransportError(fmt::format("store: cannot read '{}/{}': {}", dir, name, why));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

// The names in the directory (a descriptor of its own: readdir moves the offset it shares with its dups).
std::vector<std::string> entries(int dfd) {
  std::vector<std::string> names;
  const int fd = ::openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* d = fd < 0 ? nullptr : ::fdopendir(fd);
  if (!d) {
    if (fd >= 0) ::close(fd);
    return names;
  }
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

// The directory, opened once (its path, which the user chose, may pass links) and checked; -1 when it is absent.
int open_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    throw InvalidArgument(
        fmt::format("store: cannot open directory '{}': {} (HOPWISE_STORE=file:///DIR names a "
                    "directory; {})",
                    dir, std::strerror(errno), kSafeDir));
  }
  struct stat st;
  std::string wrong;
  if (::fstat(fd, &st) != 0)
    wrong = fmt::format("store: cannot look at directory '{}': {}", dir, std::strerror(errno));
  else if (st.st_uid != ::geteuid())
    wrong = fmt::format(
        "store: directory '{}' belongs to user {}, not to this user ({}): its owner could replace "
        "the store's files; use a directory of your own ({})",
        dir, st.st_uid, ::geteuid(), kSafeDir);
  else if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))
    wrong = fmt::format(
        "store: directory '{}' is writable by other users (mode {:04o}) without the sticky bit: "
        "anyone could replace the store's files; make it private (chmod o-w '{}'), set the sticky "
        "bit (chmod +t '{}') or use a new one (mkdir -m 700 DIR)",
        dir, st.st_mode & 07777, dir, dir);
  if (wrong.empty()) return fd;
  ::close(fd);
  throw InvalidArgument(wrong);
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

bool holds_keys(int dfd) {
  for (const auto& name : entries(dfd))
    if (name.rfind("k-", 0) == 0) return true;
  return false;
}

}  // namespace

FileStore::FileStore(std::string dir, bool claim, std::string job, Seconds timeout, int attempt)
    : dir_(std::move(dir)) {
  if (job.find('\n') != std::string::npos)
    throw InvalidArgument(fmt::format("store: a job name may not hold a line break ('{}')", job));
  try {
    if (claim) {
      // A directory the store makes is private (0700): only this user's ranks write it.
      std::string path = dir_;
      while (path.size() > 1 && path.back() == '/') path.pop_back();
      std::error_code ec;
      if (const auto parent = fs::path(path).parent_path(); !parent.empty()) fs::create_directories(parent, ec);
      if (ec || (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST))
        throw InvalidArgument(
            fmt::format("store: cannot create directory '{}': {}", dir_, ec ? ec.message() : std::strerror(errno)));
      dir_fd_ = open_dir(dir_);
      if (dir_fd_ < 0)
        throw InvalidArgument(
            fmt::format("store: directory '{}' vanished as it was made; is another job using it?", dir_));
      if (const auto text = read_entry(dir_fd_, dir_, "job")) {
        const Record old = parse_record(*text);
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
      } else if (holds_keys(dir_fd_)) {
        throw Error(
            fmt::format("store: directory '{}' holds keys of no recorded job (stale files?): remove it or use a "
                        "new directory",
                        dir_));
      }
      write_file("job", fmt::format("{}\nattempt {}\nclaim {}\n", job, attempt, claim_id()));
      return;
    }
    // The directory is opened afresh until it holds this claim: the claiming rank may not have made it yet, or an
    // earlier run's last rank may still be removing its own.
    Record seen;
    const bool ok = poll_until(
        [&] {
          close_dir();
          dir_fd_ = open_dir(dir_);
          if (dir_fd_ < 0) return false;
          const auto text = read_entry(dir_fd_, dir_, "job");
          if (!text) return false;
          seen = parse_record(*text);
          return seen.job == job && seen.attempt == attempt;
        },
        timeout);
    if (ok) return;
    if (!seen.job.empty() && seen.job != job)
      throw Error(
          fmt::format("store: directory '{}' belongs to job '{}', not to this job '{}' (a stale directory of an "
                      "earlier run?): remove it or use a new directory",
                      dir_, seen.job, job));
    throw TimeoutError(
        fmt::format("store: directory '{}' was not claimed for attempt {} of job '{}' within {:.1f} s: the "
                    "claiming rank (rank 0) has not started, or this is not its directory",
                    dir_, attempt, job, timeout.count()),
        {0});
  } catch (...) {
    close_dir();  // no destructor runs for a constructor that throws
    throw;
  }
}

FileStore::~FileStore() { close_dir(); }

void FileStore::close_dir() {
  if (dir_fd_ >= 0) ::close(dir_fd_);
  dir_fd_ = -1;
}

std::string FileStore::name_of(const std::string& key) const {
  static constexpr char kHex[] = "0123456789abcdef";
  if (key.size() > 120)  // hex doubles it, and a file name may have 255 bytes
    throw InvalidArgument(fmt::format("store '{}': key '{}...' is {} bytes; a file store's key may have at most 120",
                                      dir_, key.substr(0, 40), key.size()));
  std::string name = "k-";
  for (unsigned char c : key) {
    name += kHex[c >> 4];
    name += kHex[c & 15];
  }
  return name;
}

// Written to a fresh file (O_EXCL: never one another writer made, nor a link) and renamed over `name`: rename
// replaces a link or FIFO there, never writes through it.
void FileStore::write_file(const std::string& name, const std::string& value) const {
  std::string tmp;
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 100; ++tries) {
    std::random_device rd;
    tmp = fmt::format("tmp-{}-{:08x}{:08x}", host_name(), rd(), rd());
    fd = ::openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw TransportError(fmt::format("store: cannot create a file in '{}': {}", dir_, std::strerror(errno)));
  auto fail = [&](const std::string& what) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    ::unlinkat(dir_fd_, tmp.c_str(), 0);
    throw TransportError(fmt::format("store: cannot {} '{}/{}': {}", what, dir_, tmp, why));
  };
  for (std::size_t at = 0; at < value.size();) {
    const ssize_t n = ::write(fd, value.data() + at, value.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write");
    at += static_cast<std::size_t>(n);
  }
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("write");
  if (::renameat(dir_fd_, tmp.c_str(), dir_fd_, name.c_str()) != 0) {
    const int e = errno;
    ::unlinkat(dir_fd_, tmp.c_str(), 0);
    probe(dir_fd_, dir_, name);  // names a directory in the way
    throw TransportError(
        fmt::format("store: cannot rename '{}/{}' to '{}/{}': {}", dir_, tmp, dir_, name, std::strerror(e)));
  }
}

// Unlinks names, never what they point to; a directory in the way stays (and is refused when read).
void FileStore::remove_keys() const {
  for (const auto& name : entries(dir_fd_))
    if (name.rfind("k-", 0) == 0 || name.rfind("tmp-", 0) == 0) ::unlinkat(dir_fd_, name.c_str(), 0);
}

void FileStore::leave(int size) {
  if (add("hopwise/left", 1) < size) return;
  remove_keys();
  for (const char* name : {"job", "lock"}) ::unlinkat(dir_fd_, name, 0);
  ::rmdir(dir_.c_str());  // only when nothing else is in it
}

void FileStore::set(const std::string& key, const std::string& value) { write_file(name_of(key), value); }

std::string FileStore::get(const std::string& key, Seconds timeout) {
  wait({key}, timeout);
  const std::string name = name_of(key);
  if (auto value = read_entry(dir_fd_, dir_, name)) return *value;
  throw Error(
      fmt::format("store: '{}/{}' (key '{}') was removed as it was read: is another job clearing this "
                  "directory? Use a directory of its own",
                  dir_, name, key));
}

void FileStore::wait(const std::vector<std::string>& keys, Seconds timeout) {
  std::size_t next = 0;  // keys appear in any order; those found stay found
  if (poll_until(
          [&] {
            while (next < keys.size() && probe(dir_fd_, dir_, name_of(keys[next]))) ++next;
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
    if (!probe(dir_fd_, dir_, name_of(k))) return false;
  return true;
}

// Read, add, write under an exclusive lock on "<dir>/lock": an fcntl lock across processes (and hosts that share
// the file system's locking), and a mutex among this process's threads, which fcntl locks do not keep apart.
std::int64_t FileStore::add(const std::string& key, std::int64_t delta) {
  static std::mutex threads;
  std::lock_guard process_lock(threads);
  const int fd = open_entry(dir_fd_, dir_, "lock", O_RDWR | O_CREAT);
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  int locked;
  while ((locked = ::fcntl(fd, F_SETLKW, &fl)) != 0 && errno == EINTR) {
  }
  if (locked != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw TransportError(fmt::format("store: cannot lock '{}/lock': {}", dir_, why));
  }
  std::int64_t v = 0;
  try {
    const std::string name = name_of(key);
    const auto old = read_entry(dir_fd_, dir_, name);
    v = store_protocol::checked_add(key, old ? &*old : nullptr, delta,
                                    fmt::format("store: file '{}/{}': ", dir_, name));
    write_file(name, std::to_string(v));
  } catch (...) {
    ::close(fd);  // releases the lock
    throw;
  }
  ::close(fd);
  return v;
}

}  // namespace hopwise::comm
