// The algorithm table: the built-in rows in id order, then the rows registered from outside. Rows are written
// once and never moved (a fixed array published by an atomic count), so lookups on every call take no lock.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <iterator>
#include <mutex>
#include <utility>

#include "algorithms.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

constexpr std::size_t kMaxAlgorithms = 64;
// Registered rows' tags start here: above the built-ins' fixed tags and their ring channels' (algorithms.h), within
// the 32 bits every transport carries.
constexpr int kFirstRegisteredTag = 1 << 24;
constexpr int kMaxTagsPerRow = 1 << 16;

// The built-in rows, each beside the enum id it must get (rows are numbered in this order): a row out of place, or
// an enum value without its row, fails to compile.
struct BuiltIn {
  Algorithm id;
  AlgorithmInfo (*row)();
};
constexpr BuiltIn kBuiltIns[] = {
    {Algorithm::kRing, algo::ring_row},
    {Algorithm::kHalvingDoubling, algo::halving_doubling_row},
    {Algorithm::kTree, algo::tree_row},
    {Algorithm::kNative, algo::native_row},
    {Algorithm::kOneShot, algo::one_shot_row},
    {Algorithm::kTwoShot, algo::two_shot_row},
    {Algorithm::kHierarchical, algo::hierarchical_row},
};
constexpr bool built_ins_in_id_order() {
  for (std::size_t i = 0; i < std::size(kBuiltIns); ++i)
    if (static_cast<std::size_t>(kBuiltIns[i].id) != i + 1) return false;
  return std::size(kBuiltIns) + 1 == static_cast<std::size_t>(Algorithm::kFirstRegistered);
}
static_assert(built_ins_in_id_order(),
              "kBuiltIns must list one row per built-in Algorithm id, in the enum's order (algorithm.h)");

bool answers_to(const AlgorithmInfo& row, std::string_view name) {
  return row.name == name || std::find(row.aliases.begin(), row.aliases.end(), name) != row.aliases.end();
}

struct Table {
  std::array<AlgorithmInfo, kMaxAlgorithms> rows;  // rows[i] has id i + 1 (id 0 is auto)
  std::atomic<std::size_t> count{0};
  std::mutex adding;
  int next_tag = kFirstRegisteredTag;

  Table() {
    for (const BuiltIn& b : kBuiltIns) add(b.row());  // ids 1, 2, ...: kBuiltIns' order, checked above
  }

  bool taken(std::string_view name) const {
    if (name == "auto") return true;
    for (std::size_t i = 0; i < count.load(std::memory_order_acquire); ++i)
      if (answers_to(rows[i], name)) return true;
    return false;
  }

  Algorithm add(AlgorithmInfo row) {
    std::lock_guard lock(adding);
    if (row.name.empty()) throw InvalidArgument("register_algorithm: the row needs a name");
    std::vector<std::string> names = row.aliases;
    names.push_back(row.name);
    for (const std::string& n : names)
      if (taken(n))
        throw InvalidArgument(fmt::format("register_algorithm: the name '{}' is already taken; pick another", n));
    if (!row.run || row.collectives.empty())
      throw InvalidArgument(
          fmt::format("register_algorithm: '{}' needs a run function and the collectives it "
                      "implements",
                      row.name));
    const std::size_t i = count.load();
    if (i == kMaxAlgorithms)
      throw InvalidArgument(fmt::format("register_algorithm: the table is full ({} rows)", kMaxAlgorithms));
    if (row.tags < 0 || row.tags > kMaxTagsPerRow)
      throw InvalidArgument(fmt::format("register_algorithm: '{}' asks for {} tags; a row may have 0 to {}", row.name,
                                        row.tags, kMaxTagsPerRow));
    row.id = static_cast<Algorithm>(i + 1);
    row.first_tag = row.tags > 0 ? next_tag : 0;
    next_tag += row.tags;
    if (!row.estimate) row.estimate = [](const CostQuery&) { return static_cast<double>(INFINITY); };
    rows[i] = std::move(row);
    count.store(i + 1, std::memory_order_release);
    return rows[i].id;
  }
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

Algorithm register_algorithm(AlgorithmInfo info) { return table().add(std::move(info)); }

const AlgorithmInfo& algorithm_info(Algorithm a) {
  Table& t = table();
  const auto i = static_cast<std::size_t>(a);
  if (i == 0 || i > t.count.load(std::memory_order_acquire))
    throw InvalidArgument(fmt::format("no algorithm with id {} in the table", static_cast<int>(a)));
  return t.rows[i - 1];
}

std::vector<Algorithm> all_algorithms() {
  Table& t = table();
  std::vector<Algorithm> out;
  for (std::size_t i = 0; i < t.count.load(std::memory_order_acquire); ++i) out.push_back(t.rows[i].id);
  return out;
}

std::string_view to_string(Algorithm a) {
  if (a == Algorithm::kAuto) return "auto";
  Table& t = table();
  const auto i = static_cast<std::size_t>(a);
  if (i == 0 || i > t.count.load(std::memory_order_acquire)) return "unknown";
  return t.rows[i - 1].name;
}

std::string_view to_string(Collective c) {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllgather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kBarrier: return "barrier";
    case Collective::kSend: return "send";
    case Collective::kRecv: return "recv";
  }
  return "unknown";
}

Algorithm parse_algorithm(std::string_view n) {
  if (n == "auto") return Algorithm::kAuto;
  std::string names = "auto";
  for (Algorithm a : all_algorithms()) {
    const AlgorithmInfo& r = algorithm_info(a);
    if (answers_to(r, n)) return a;
    names += ", " + r.name;
  }
  throw InvalidArgument(fmt::format("unknown algorithm '{}'; use one of {}", n, names));
}

namespace {
// One row per user above the engine, each range within algo::kTagReserved .. the ring channels' first offset.
constexpr std::pair<std::string_view, TagRange> kReserved[] = {
    {"gossip", {algo::kTagReserved, 3000}},  // + the round's partner index in a step (gossip:peers)
};
constexpr bool reserved_ranges_fit() {
  int next = algo::kTagReserved;
  for (const auto& [name, range] : kReserved) {
    if (range.first < next || range.count < 1) return false;
    next = range.first + range.count;
  }
  return next <= algo::kRingChannelTagStride;
}
static_assert(reserved_ranges_fit(),
              "kReserved's ranges must ascend, apart, within kTagReserved .. the ring channels'");
}  // namespace

TagRange reserved_tags(std::string_view user) {
  std::string names;
  for (const auto& [name, range] : kReserved) {
    if (name == user) return range;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", name);
  }
  throw InvalidArgument(
      fmt::format("no message tags are reserved for '{}'; the reserved ones are for {}", user, names));
}

bool implements(Algorithm a, Collective c) {
  if (a == Algorithm::kAuto) return true;
  const auto& cs = algorithm_info(a).collectives;
  return std::find(cs.begin(), cs.end(), c) != cs.end();
}

}  // namespace hopwise::comm
