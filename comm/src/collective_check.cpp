#include "collective_check.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <tuple>

#include "algorithms/algorithms.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

bool has_op(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}
bool has_root(Collective c) { return c == Collective::kBroadcast || c == Collective::kReduce; }

// "rank 2", "ranks 0,1,3", "ranks 0-31,33".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += j >= i + 2 ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    if (j == i + 1) s += fmt::format(",{}", ranks[j]);
    i = j + 1;
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

std::string codec_of(const CollectiveCheck::Wire& w) {
  return w.codec[0] == '\0' ? std::string("none") : std::string(w.codec, strnlen(w.codec, sizeof w.codec));
}

using Key =
    std::tuple<std::int32_t, std::uint64_t, std::int32_t, std::int32_t, std::int32_t, std::int32_t, std::uint64_t>;
Key key_of(const CollectiveCheck::Wire& w) {
  return {w.collective, w.count, w.dtype, w.op, w.root, w.algorithm, w.codec_hash};
}

}  // namespace

CollectiveCheck::Wire CollectiveCheck::to_wire(const CallSignature& call, std::uint64_t seq) {
  Wire w;
  w.seq = seq;
  w.collective = static_cast<std::int32_t>(call.collective);
  w.count = call.collective == Collective::kBarrier ? 0 : call.count;
  w.dtype = call.collective == Collective::kBarrier ? 0 : static_cast<std::int32_t>(call.dtype);
  w.op = has_op(call.collective) ? static_cast<std::int32_t>(call.op) : 0;
  w.root = has_root(call.collective) ? call.root : 0;
  w.algorithm = static_cast<std::int32_t>(call.algorithm);
  w.codec_hash = call.codec.empty() ? 0 : fnv1a(call.codec);
  if (!call.codec.empty())  // an empty view's data() may be null, and memcpy from null is undefined even for 0 bytes
    std::memcpy(w.codec, call.codec.data(), std::min(call.codec.size(), sizeof w.codec - 1));
  return w;
}

std::string CollectiveCheck::describe_mismatch(const std::vector<Wire>& all, std::string_view source,
                                               const std::vector<int>& ranks) {
  const int p = static_cast<int>(all.size());
  // Entry i is rank ranks[i] (by default rank i).
  auto rank_of = [&](int i) { return ranks.empty() ? i : ranks[static_cast<std::size_t>(i)]; };
  auto names = [&](const std::vector<int>& entries) {
    std::vector<int> v;
    for (int i : entries) v.push_back(rank_of(i));
    std::sort(v.begin(), v.end());
    return rank_list(v);
  };
  std::map<Key, std::vector<int>> groups;
  for (int r = 0; r < p; ++r) groups[key_of(all[static_cast<std::size_t>(r)])].push_back(r);
  if (groups.size() <= 1) return {};

  // The call most ranks make (ties: the one the lowest rank makes); the others are the ranks that disagree.
  const auto majority = std::max_element(groups.begin(), groups.end(), [&](const auto& a, const auto& b) {
    return a.second.size() != b.second.size() ? a.second.size() < b.second.size()
                                              : rank_of(a.second[0]) > rank_of(b.second[0]);
  });
  std::vector<int> odd;
  for (int r = 0; r < p; ++r)
    if (key_of(all[static_cast<std::size_t>(r)]) != majority->first) odd.push_back(r);

  // Per field that differs: each value and the ranks that pass it.
  std::string fields;
  auto field = [&](const char* name, const std::function<std::string(const Wire&)>& value) {
    std::map<std::string, std::vector<int>> by_value;
    for (int r = 0; r < p; ++r) by_value[value(all[static_cast<std::size_t>(r)])].push_back(r);
    if (by_value.size() <= 1) return;
    std::vector<std::pair<std::string, std::vector<int>>> v(by_value.begin(), by_value.end());
    auto lowest = [&](const std::vector<int>& entries) {
      int m = rank_of(entries[0]);
      for (int i : entries) m = std::min(m, rank_of(i));
      return m;
    };
    std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return lowest(a.second) < lowest(b.second); });
    fields += fmt::format("; {}:", name);
    for (std::size_t i = 0; i < v.size(); ++i)
      fields += fmt::format("{} {} on {}", i == 0 ? "" : ",", v[i].first, names(v[i].second));
  };
  field("collective", [](const Wire& w) { return std::string(to_string(static_cast<Collective>(w.collective))); });
  field("count", [](const Wire& w) { return fmt::format("{}", w.count); });
  field("dtype", [](const Wire& w) { return std::string(to_string(static_cast<DataType>(w.dtype))); });
  field("op", [](const Wire& w) {
    return has_op(static_cast<Collective>(w.collective)) ? std::string(to_string(static_cast<ReduceOp>(w.op)))
                                                         : std::string("(none)");
  });
  field("root", [](const Wire& w) {
    return has_root(static_cast<Collective>(w.collective)) ? fmt::format("{}", w.root) : std::string("(none)");
  });
  field("algorithm", [](const Wire& w) { return std::string(to_string(static_cast<Algorithm>(w.algorithm))); });
  field("codec", [](const Wire& w) { return codec_of(w); });

  // With no majority (two ranks that compared their stamps) neither is the odd one.
  std::vector<int> everyone(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) everyone[static_cast<std::size_t>(r)] = r;
  const std::string who =
      majority->second.size() == 1
          ? names(everyone) + " disagree"
          : fmt::format("{} from {}", names(odd) + (odd.size() == 1 ? " differs" : " differ"), names(majority->second));
  std::string calls;
  std::map<std::uint64_t, std::vector<int>> by_seq;
  for (int r = 0; r < p; ++r) by_seq[all[static_cast<std::size_t>(r)].seq].push_back(r);
  if (by_seq.size() == 1) {
    calls = fmt::format("call #{} on this communicator", by_seq.begin()->first);
  } else {
    calls = "calls";
    for (const auto& [seq, entries] : by_seq) calls += fmt::format(" #{} on {},", seq, names(entries));
    calls.pop_back();
  }
  return fmt::format(
      "ranks disagree on the collective call ({}, {}): {}{}; every "
      "rank must make the same collective calls in the same order with the same count, dtype, op and "
      "root",
      source, calls, who, fields);
}

// Every rank that gave up sends every other a note and listens for theirs, up to `listen`: who is heard gave up
// in this call too; who is silent is at fault.
static std::vector<int> notes_from_ranks_that_gave_up(Transport& t, std::chrono::duration<double> listen) {
  const int p = t.size(), me = t.rank();
  // Never freed: a withdrawn send may still be read, and a late note must land somewhere.
  auto* notes = new std::vector<std::int64_t>(static_cast<std::size_t>(p) + 1, me);
  std::vector<Request> recvs(static_cast<std::size_t>(p)), sends(static_cast<std::size_t>(p));
  std::vector<int> heard{me};
  try {
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      recvs[static_cast<std::size_t>(q)] =
          t.irecv(&(*notes)[static_cast<std::size_t>(q)], sizeof(std::int64_t), q, algo::kTagAlive);
      sends[static_cast<std::size_t>(q)] = t.isend(&notes->back(), sizeof(std::int64_t), q, algo::kTagAlive);
    }
    const auto deadline = std::chrono::steady_clock::now() + listen;
    while (static_cast<int>(heard.size()) < p && std::chrono::steady_clock::now() < deadline) {
      for (int q = 0; q < p; ++q) {
        Request& r = recvs[static_cast<std::size_t>(q)];
        if (r.active && t.test(r)) heard.push_back(q);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  } catch (const std::exception&) {
    // A transport failing towards a dead peer: judge by the notes that did arrive.
  }
  for (auto* v : {&recvs, &sends})
    for (Request& r : *v)
      if (r.active) {
        try {
          t.cancel(r);
        } catch (const std::exception&) {
        }
      }
  return heard;
}

std::string explain_timeout(Transport& t, std::chrono::duration<double> listen) {
  const int p = t.size(), me = t.rank();
  if (p <= 1) return {};
  std::vector<int> heard{me};
  if (auto known = t.ranks_that_gave_up(listen)) {
    heard = *known;  // the transport keeps count of its own (UCX: through the store)
  } else {
    heard = notes_from_ranks_that_gave_up(t, listen);
  }
  std::sort(heard.begin(), heard.end());
  heard.erase(std::unique(heard.begin(), heard.end()), heard.end());

  std::vector<int> silent;
  for (int q = 0; q < p; ++q)
    if (!std::binary_search(heard.begin(), heard.end(), q)) silent.push_back(q);
  if (silent.empty())
    return "; every rank gave up in this call, none is missing: they wait on each other (different collectives or "
           "arguments on different ranks? HOPWISE_DEBUG=CHECK compares them)";
  return fmt::format("; {} did not answer within {:.1f} s{}: {} stalled, died or did not make this call",
                     rank_list(silent), listen.count(),
                     heard.size() == 1 ? "" : fmt::format(" while {} gave up in this call", rank_list(heard)),
                     silent.size() == 1 ? "it" : "they");
}

void CollectiveCheck::verify(Transport& t, const CallSignature& call) {
  const int p = t.size(), me = t.rank();
  // Members, not locals: a send withdrawn after a timeout may still read its buffer.
  mine_ = to_wire(call, seq_++);
  all_.assign(static_cast<std::size_t>(p), Wire{});
  all_[static_cast<std::size_t>(me)] = mine_;
  if (p > 1) {
    Requests reqs(t);
    for (int d = 1; d < p; ++d) {
      const int from = (me - d + p) % p, to = (me + d) % p;
      reqs.push_back(t.irecv(&all_[static_cast<std::size_t>(from)], sizeof(Wire), from, algo::kTagCheck));
      reqs.push_back(t.isend(&mine_, sizeof(Wire), to, algo::kTagCheck));
    }
    try {
      t.wait_all(reqs);
    } catch (const TimeoutError& e) {
      throw TimeoutError(fmt::format("comparing calls (HOPWISE_DEBUG=CHECK): {}", e.what()), e.pending_ranks());
    }
  }
  const std::string why = describe_mismatch(all_);
  if (!why.empty()) throw InvalidArgument(why);
}

}  // namespace hopwise::comm
