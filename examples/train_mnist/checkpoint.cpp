#include "checkpoint.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::examples {

namespace {

namespace fs = std::filesystem;

constexpr const char* kMagic = "hopwise-train_mnist-checkpoint";
constexpr int kVersion = 3;          // 2: the averaging state as the header's third line
constexpr std::size_t kKept = 2;     // files each rank keeps: the newest step and the one before
constexpr std::size_t kOffered = 4;  // newest whole steps each rank offers when the ranks agree on one

// Each rank's `mine` (n values), in rank order.
std::vector<std::int64_t> gather(comm::Communicator& comm, const std::vector<std::int64_t>& mine) {
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(mine.data(), all.data(), mine.size(), DataType::kInt64);
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

fs::path directory_of(const std::string& base) {
  const fs::path parent = fs::path(base).parent_path();
  return parent.empty() ? fs::current_path() : parent;
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // some file systems cannot open a directory; the rename stands
  ::fsync(fd);
  ::close(fd);
}

// One number of a header line, ending in `end` (a space or the newline), within [lo, hi]; `at` moves past `end`.
// std::from_chars, not >>: it takes no sign where T has none, no spaces, and says when a value does not fit T.
template <class T>
bool take_number(std::string_view text, std::size_t& at, char end, T lo, T hi, T& out) {
  const char* last = text.data() + text.size();
  const auto [ptr, err] = std::from_chars(text.data() + at, last, out);
  if (err != std::errc() || ptr == last || *ptr != end || out < lo || out > hi) return false;
  at = static_cast<std::size_t>(ptr - text.data()) + 1;
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return S_ISCHR(mode) || S_ISBLK(mode) ? "a device" : "not a regular file";
}

// Only regular files are read: open() of a FIFO waits for a writer (forever, for a planted one) and a symlink may
// lead anywhere (/dev/zero never ends). O_NONBLOCK lets the open of a FIFO return, O_NOFOLLOW refuses a symlink,
// fstat tells the rest. -1 with `why` where the file is not one to read.
int open_regular(const fs::path& path, std::string& why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    why = errno == ELOOP ? "a symbolic link, which is not followed" : std::strerror(errno);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = fmt::format("{}, not a regular file", kind_of(st.st_mode));
    ::close(fd);
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);  // back to blocking reads, as for any regular file
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

// Reads n bytes at `offset`; false where the file ends first or a read fails.
bool read_at(int fd, void* data, std::size_t n, std::uint64_t offset) {
  char* p = static_cast<char*>(data);
  for (std::size_t at = 0; at < n;) {
    const ssize_t r = ::pread(fd, p + at, n - at, static_cast<off_t>(offset + at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    at += static_cast<std::size_t>(r);
  }
  return true;
}

// The header of the open file, when the file is one of ours and exactly as long as its counts say; else `why` not.
std::optional<CheckpointHeader> read_header(int fd, std::string& why) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    why = std::strerror(errno);
    return std::nullopt;
  }
  std::string head(std::min<std::uint64_t>(static_cast<std::uint64_t>(st.st_size), kMaxCheckpointHeader), '\0');
  if (!read_at(fd, head.data(), head.size(), 0)) {
    why = "unreadable";
    return std::nullopt;
  }
  auto h = parse_checkpoint_header(head);
  if (!h) {
    why = fmt::format(
        "not a train_mnist checkpoint: no version {} header with steps 0..{}, ranks 1..{}, parameters 1..{} and "
        "at most 32 B per parameter + 1 MiB of averaging state",
        kVersion, kMaxCheckpointSteps, kMaxCheckpointRanks, kMaxCheckpointCount);
    return std::nullopt;
  }
  if (static_cast<std::uint64_t>(st.st_size) != h->file_size()) {
    why = fmt::format("cut short or overlong ({} bytes; its header says {})", st.st_size, h->file_size());
    return std::nullopt;
  }
  return h;
}

// The header of `file`, named for `step`, when it is a whole checkpoint of ours for that step; else `why` not.
std::optional<CheckpointHeader> inspect(const fs::path& file, std::int64_t step, std::string& why) {
  const Fd in{open_regular(file, why)};
  if (in.fd < 0) return std::nullopt;
  auto h = read_header(in.fd, why);
  if (h && h->c.steps_done != step) {
    why = fmt::format("of step {}", h->c.steps_done);
    return std::nullopt;
  }
  return h;
}

// Each file that is not a valid checkpoint is named once: retention meets it again at every save.
void warn_skipped(const fs::path& file, const std::string& why) {
  static std::set<std::string> named;
  if (named.insert(file.string()).second)
    log::warn("checkpoint {} is {}: skipped (not loaded, not counted as a save, not removed; remove it if unneeded)",
              file.string(), why);
}

// The steps of this rank's files under `base` (PATH.step<S>.rank<R>[.tmp]).
std::vector<std::pair<std::int64_t, fs::path>> own_files(const std::string& base, int rank, bool temporary) {
  const std::string stem = fs::path(base).filename().string() + ".step";
  const std::string tail = fmt::format(".rank{}{}", rank, temporary ? ".tmp" : "");
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_of(base), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= stem.size() + tail.size() || !name.starts_with(stem) || !name.ends_with(tail)) continue;
    const char* first = name.data() + stem.size();
    const char* last = name.data() + name.size() - tail.size();
    std::int64_t step = -1;
    const auto [end, err] = std::from_chars(first, last, step);
    if (err == std::errc() && end == last && step >= 0) found.emplace_back(step, entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

std::string run_name(std::uint64_t run) { return fmt::format("{:016x}", run); }

// "rank 0: 40, 20; rank 1: none": what each rank offered.
std::string offers_text(const std::vector<std::int64_t>& all, int ranks) {
  std::string s;
  for (int r = 0; r < ranks; ++r) {
    std::string steps;
    for (std::size_t i = 0; i < kOffered; ++i)
      if (const auto v = all[static_cast<std::size_t>(r) * 2 * kOffered + i]; v >= 0)
        steps += fmt::format("{}{}", steps.empty() ? "" : ", ", v);
    s += fmt::format("{}rank {}: {}", s.empty() ? "" : "; ", r, steps.empty() ? "none" : steps);
  }
  return s;
}

// After a save: this run's kKept newest valid files stay (the one just saved among them); older valid files go,
// this run's and, below this run's newest, an earlier run's at this path. A file that does not read as a whole
// checkpoint is neither counted nor removed: counted, cut-short files at higher steps pushed every new save out as
// soon as it was written; and a file that is not ours to read may be someone else's. Where it lies it does no harm
// (a resume skips it), so it is named once and left.
void remove_older_saves(const std::string& base, int rank, std::uint64_t run) {
  std::size_t kept = 0;
  std::error_code ec;
  for (const auto& [step, file] : own_files(base, rank, false)) {
    std::string why;
    const auto h = inspect(file, step, why);
    if (!h) {
      warn_skipped(file, why);
      continue;
    }
    const bool this_run = h->c.run == run;
    if (this_run && kept < kKept) {
      ++kept;
      continue;
    }
    if (!this_run && kept == 0) continue;  // another run's, newer than this run's saves: not this run's to judge
    fs::remove(file, ec);
  }
  // Temporary files a killed attempt left.
  for (const auto& [step, file] : own_files(base, rank, true)) fs::remove(file, ec);
}

}  // namespace

std::string checkpoint_header_text(const Checkpoint& c, std::size_t count, std::uint64_t averaging_bytes) {
  return fmt::format("{} {}\n{} {} {} {} {} {}\n", kMagic, kVersion, c.steps_done, c.ranks, c.batch, c.run, count,
                     averaging_bytes);
}

std::optional<CheckpointHeader> parse_checkpoint_header(std::string_view bytes) {
  bytes = bytes.substr(0, std::min(bytes.size(), kMaxCheckpointHeader));
  const std::string first = fmt::format("{} {}\n", kMagic, kVersion);
  if (!bytes.starts_with(first)) return std::nullopt;
  CheckpointHeader h;
  std::size_t at = first.size();
  constexpr auto kAnyRun = std::numeric_limits<std::uint64_t>::max();
  if (!take_number(bytes, at, ' ', std::int64_t{0}, kMaxCheckpointSteps, h.c.steps_done) ||
      !take_number(bytes, at, ' ', 1, kMaxCheckpointRanks, h.c.ranks) ||
      !take_number(bytes, at, ' ', 1, std::numeric_limits<int>::max(), h.c.batch) ||
      !take_number(bytes, at, ' ', std::uint64_t{0}, kAnyRun, h.c.run) ||
      !take_number(bytes, at, ' ', std::size_t{1}, kMaxCheckpointCount, h.count))
    return std::nullopt;
  // Bounded by the model: a resume allocates what this says.
  if (!take_number(bytes, at, '\n', std::uint64_t{0}, max_averaging_bytes(h.count), h.averaging_bytes))
    return std::nullopt;
  h.length = at;
  return h;
}

std::string checkpoint_path(const std::string& base, std::int64_t step, int rank) {
  return fmt::format("{}.step{}.rank{}", base, step, rank);
}

std::uint64_t new_run_id(comm::Communicator& comm) {
  std::int64_t id = 0;
  if (comm.rank() == 0)
    id = std::bit_cast<std::int64_t>((std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}());
  comm.broadcast(&id, 1, DataType::kInt64, 0);
  return std::bit_cast<std::uint64_t>(id);
}

void save_checkpoint(comm::Communicator& comm, const std::string& base, const Checkpoint& c, const float* params,
                     const float* velocity, std::size_t count) {
  const std::string path = checkpoint_path(base, c.steps_done, comm.rank()), tmp = path + ".tmp";
  std::string failure;
  try {
    // Never a file that a resume would refuse.
    if (c.averaging.size() > max_averaging_bytes(count))
      throw Error(
          fmt::format("checkpoint {}: the averaging state is {} bytes, more than the {} a model of {} "
                      "parameters may keep",
                      path, c.averaging.size(), max_averaging_bytes(count), count));
    const std::string head = checkpoint_header_text(c, count, c.averaging.size());
    // A fresh file, never one a killed attempt left nor what a planted name leads to (a FIFO, a symlink).
    ::unlink(tmp.c_str());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(fmt::format("cannot write the checkpoint {}: {}", tmp, std::strerror(errno)));
    try {
      write_all(fd, head.data(), head.size(), tmp);
      write_all(fd, params, count * sizeof(float), tmp);
      write_all(fd, velocity, count * sizeof(float), tmp);
      write_all(fd, c.averaging.data(), c.averaging.size(), tmp);
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
  const auto ok = gather(comm, {failure.empty() ? 1 : 0});
  std::string failed;
  for (std::size_t r = 0; r < ok.size(); ++r)
    if (!ok[r]) failed += fmt::format("{}{}", failed.empty() ? "" : ", ", r);
  if (!failed.empty()) {
    std::remove(tmp.c_str());
    throw Error(
        fmt::format("checkpoint at step {} not saved: rank(s) {} could not write theirs{}; the last "
                    "checkpoint stands",
                    c.steps_done, failed, failure.empty() ? "" : " (here: " + failure + ")"));
  }
  fs::rename(tmp, path);
  sync_directory(directory_of(base));
  remove_older_saves(base, comm.rank(), c.run);
}

std::optional<Checkpoint> load_newest_checkpoint(comm::Communicator& comm, const std::string& base, float* params,
                                                 float* velocity, std::size_t count) {
  const int p = comm.size();
  // Offer the newest whole files: kOffered steps, then their runs.
  std::vector<std::int64_t> offer(2 * kOffered, -1);
  std::size_t offered = 0;
  for (const auto& [step, file] : own_files(base, comm.rank(), false)) {
    if (offered == kOffered) break;
    std::string why;
    const auto h = inspect(file, step, why);
    if (!h) {
      warn_skipped(file, why);
      continue;
    }
    offer[offered] = step;
    offer[kOffered + offered++] = std::bit_cast<std::int64_t>(h->c.run);
  }
  const auto all = gather(comm, offer);
  auto at = [&](int r, std::size_t i) { return all[static_cast<std::size_t>(r) * 2 * kOffered + i]; };
  bool any = false;
  for (int r = 0; r < p; ++r) any |= at(r, 0) >= 0;
  if (!any) return std::nullopt;
  // The newest step every rank offers (the same decision on every rank: all see the same offers).
  std::int64_t common = -1;
  for (std::size_t i = 0; i < kOffered && common < 0; ++i) {
    const std::int64_t s = at(0, i);
    if (s < 0) break;
    bool everywhere = true;
    for (int r = 1; r < p && everywhere; ++r) {
      bool has = false;
      for (std::size_t j = 0; j < kOffered; ++j) has |= at(r, j) == s;
      everywhere = has;
    }
    if (everywhere) common = s;
  }
  if (common < 0)
    throw InvalidArgument(fmt::format(
        "checkpoint {}: no step that every rank holds whole ({}); files lost or of another job? point --resume "
        "elsewhere, or remove {}.step* to start afresh",
        base, offers_text(all, p), base));
  std::vector<std::uint64_t> runs(static_cast<std::size_t>(p));
  std::string differ;
  for (int r = 0; r < p; ++r) {
    for (std::size_t j = 0; j < kOffered; ++j)
      if (at(r, j) == common) runs[static_cast<std::size_t>(r)] = std::bit_cast<std::uint64_t>(at(r, kOffered + j));
    if (runs[static_cast<std::size_t>(r)] != runs[0]) differ += fmt::format("{}{}", differ.empty() ? "" : ", ", r);
  }
  if (!differ.empty()) {
    std::string each;
    for (int r = 0; r < p; ++r)
      each += fmt::format("{}rank {}: {}", each.empty() ? "" : ", ", r, run_name(runs[static_cast<std::size_t>(r)]));
    throw InvalidArgument(
        fmt::format("checkpoint {}: the ranks' files of step {} are of different runs ({}); rank(s) {} differ from "
                    "rank 0 (files of different runs mixed?): resume every rank from one run's files",
                    base, common, each, differ));
  }
  // Every rank reads its own file; all learn what every other found, so that all fail together or none does.
  Checkpoint c;
  std::string failure;
  const std::string path = checkpoint_path(base, common, comm.rank());
  try {
    std::string why;
    const Fd in{open_regular(path, why)};
    auto h = in.fd < 0 ? std::nullopt : read_header(in.fd, why);
    if (h && h->c.steps_done != common) why = fmt::format("now of step {}", h->c.steps_done);
    if (!h || h->c.steps_done != common)
      throw InvalidArgument(fmt::format("checkpoint {} changed while it was read: {}", path, why));
    if (h->count != count)
      throw InvalidArgument(
          fmt::format("checkpoint {} holds {} parameters, this model has {}; resume with the same --hidden", path,
                      h->count, count));
    const std::uint64_t bytes = count * sizeof(float);
    c = h->c;
    c.averaging.resize(h->averaging_bytes);  // at most max_averaging_bytes(count): the header parser's bound
    if (!read_at(in.fd, params, bytes, h->length) || !read_at(in.fd, velocity, bytes, h->length + bytes) ||
        !read_at(in.fd, c.averaging.data(), c.averaging.size(), h->length + 2 * bytes))
      throw InvalidArgument(fmt::format("checkpoint {} is cut short", path));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const auto ok = gather(comm, {failure.empty() ? 1 : 0});
  if (!failure.empty()) throw InvalidArgument(failure);
  std::string unreadable;
  for (std::size_t r = 0; r < ok.size(); ++r)
    if (!ok[r]) unreadable += fmt::format("{}{}", unreadable.empty() ? "" : ", ", r);
  if (!unreadable.empty())
    throw InvalidArgument(
        fmt::format("checkpoint {}: rank(s) {} could not read their files of step {}", base, unreadable, common));
  return c;
}

}  // namespace hopwise::examples
