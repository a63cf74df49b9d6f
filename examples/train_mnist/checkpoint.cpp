#include "checkpoint.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::examples {

namespace {

namespace fs = std::filesystem;

constexpr const char* kMagic = "hopwise-train_mnist-checkpoint";
constexpr int kVersion = 2;
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

struct Header {
  Checkpoint c;
  std::size_t count = 0;
  std::streamoff data_at = 0;  // where the parameters start
};

// The file's header, or nullopt where it is not a checkpoint of this version; `whole` says its length fits.
std::optional<Header> read_header(std::ifstream& in, bool& whole) {
  std::string magic, line;
  int version = 0;
  Header h;
  in >> magic >> version >> h.c.steps_done >> h.c.ranks >> h.c.batch >> h.c.run >> h.count;
  std::getline(in, line);
  std::getline(in, h.c.averaging);
  // A count past any model's (2^36 floats: 256 GiB) or a spec line past any spec's is not a checkpoint of ours.
  if (!in || magic != kMagic || version != kVersion || h.c.steps_done < 0 || h.count > (std::size_t{1} << 36) ||
      h.c.averaging.size() > 4096)
    return std::nullopt;
  h.data_at = in.tellg();
  in.seekg(0, std::ios::end);
  whole = in.tellg() == h.data_at + static_cast<std::streamoff>(2 * h.count * sizeof(float));
  in.seekg(h.data_at);
  return h;
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

}  // namespace

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
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(fmt::format("cannot write the checkpoint {}: {}", tmp, std::strerror(errno)));
    try {
      const std::string head = fmt::format("{} {}\n{} {} {} {} {}\n{}\n", kMagic, kVersion, c.steps_done, c.ranks,
                                           c.batch, c.run, count, c.averaging);
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
  // Older steps go once the new one is in place; so do temporary files a killed attempt left.
  std::error_code ec;
  const auto files = own_files(base, comm.rank(), false);
  for (std::size_t i = kKept; i < files.size(); ++i) fs::remove(files[i].second, ec);
  for (const auto& [step, file] : own_files(base, comm.rank(), true)) fs::remove(file, ec);
}

std::optional<Checkpoint> load_newest_checkpoint(comm::Communicator& comm, const std::string& base, float* params,
                                                 float* velocity, std::size_t count) {
  const int p = comm.size();
  // Offer the newest whole files: kOffered steps, then their runs.
  std::vector<std::int64_t> offer(2 * kOffered, -1);
  std::size_t offered = 0;
  for (const auto& [step, file] : own_files(base, comm.rank(), false)) {
    if (offered == kOffered) break;
    std::ifstream in(file, std::ios::binary);
    bool whole = false;
    const auto h = read_header(in, whole);
    if (!h || !whole || h->c.steps_done != step) {
      log::warn("checkpoint {} is {}: skipped", file.string(), h ? "cut short" : "not a train_mnist checkpoint");
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
    std::ifstream in(path, std::ios::binary);
    bool whole = false;
    const auto h = read_header(in, whole);
    if (!h || !whole) throw InvalidArgument(fmt::format("checkpoint {} changed while it was read", path));
    if (h->count != count)
      throw InvalidArgument(
          fmt::format("checkpoint {} holds {} parameters, this model has {}; resume with the same --hidden", path,
                      h->count, count));
    in.read(reinterpret_cast<char*>(params), static_cast<std::streamsize>(count * sizeof(float)));
    in.read(reinterpret_cast<char*>(velocity), static_cast<std::streamsize>(count * sizeof(float)));
    if (!in) throw InvalidArgument(fmt::format("checkpoint {} is cut short", path));
    c = h->c;
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
