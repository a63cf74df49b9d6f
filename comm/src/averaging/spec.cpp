// Averaging specs ("local:period=8,warmup=100") and gossip's pairing schedule: pure functions, shared by the
// C++ averager, train_mnist and the PyTorch frontend's averagers.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <charconv>
#include <map>
#include <vector>

#include "hopwise/comm/averaging.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/spec.h"

namespace hopwise::comm {

namespace {

struct MethodRow {
  AveragingMethod method;
  const char* name;
  std::vector<const char*> fields;    // the fields it takes
  std::vector<const char*> required;  // of which these have no default
};

// One row per method: what parse accepts and the errors list.
const std::vector<MethodRow>& methods() {
  static const std::vector<MethodRow> rows = {
      {AveragingMethod::kSync, "sync", {}, {}},
      {AveragingMethod::kLocal, "local", {"period", "warmup"}, {"period"}},
      {AveragingMethod::kHier, "hier", {"period", "warmup"}, {"period"}},
      {AveragingMethod::kGossip, "gossip", {"peers", "codec"}, {}},
      {AveragingMethod::kAsync, "async", {"period", "warmup", "codec"}, {"period"}},
  };
  return rows;
}

const MethodRow& row_of(AveragingMethod m) {
  for (const auto& r : methods())
    if (r.method == m) return r;
  throw Error("internal: averaging method without a row");
}

int whole(const std::string& spec, const std::string& field, const std::string& value, int lowest, const char* what) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < lowest)
    throw InvalidArgument(
        fmt::format("averaging '{}': {}={} must be a whole number >= {} ({})", spec, field, value, lowest, what));
  return v;
}

}  // namespace

const char* to_string(AveragingMethod m) { return row_of(m).name; }

const char* to_string(GradientScope s) {
  switch (s) {
    case GradientScope::kWorld: return "world";
    case GradientScope::kHost: return "host";
    case GradientScope::kNone: return "none";
  }
  return "?";
}

AveragingSpec AveragingSpec::parse(const std::string& text) {
  compression::CodecSpec parsed;
  try {
    parsed = compression::parse_codec_spec(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("averaging '{}': {}; write e.g. local:period=8,warmup=100", text, e.what()));
  }
  const MethodRow* row = nullptr;
  std::vector<std::string> names;
  for (const auto& r : methods()) {
    names.push_back(r.name);
    if (parsed.name == r.name) row = &r;
  }
  if (!row)
    throw InvalidArgument(fmt::format("averaging method '{}' is unknown; methods: {} (e.g. local:period=8)",
                                      parsed.name, fmt::join(names, ", ")));
  for (const auto& [k, v] : parsed.params) {
    bool known = false;
    for (const char* f : row->fields) known = known || k == f;
    if (!known)
      throw InvalidArgument(
          row->fields.empty()
              ? fmt::format("averaging '{}': {} takes no fields (got {})", text, row->name, k)
              : fmt::format("averaging '{}': {} takes {}, not {}", text, row->name, fmt::join(row->fields, ", "), k));
  }
  for (const char* f : row->required)
    if (!parsed.params.count(f))
      throw InvalidArgument(fmt::format("averaging '{}': {} needs {}=H, the steps between averagings (e.g. {}:{}=8)",
                                        text, row->name, f, row->name, f));
  AveragingSpec s;
  s.method = row->method;
  for (const auto& [k, v] : parsed.params) {
    if (k == "period")
      s.period = whole(text, k, v, 1, "steps between averagings");
    else if (k == "warmup")
      s.warmup = whole(text, k, v, 0, "synchronous steps first");
    else if (k == "peers")
      s.peers = whole(text, k, v, 1, "partners per step");
    else if (k == "codec") {
      if (v != "none" && v != "fp16" && v != "bf16" && v != "int8")
        throw InvalidArgument(
            fmt::format("averaging '{}': codec={} is not one {} sends; use none, fp16, bf16 or "
                        "int8 (model differences: a codec that keeps every element)",
                        text, v, row->name));
      s.codec = v;
    }
  }
  return s;
}

std::string AveragingSpec::to_string() const {
  switch (method) {
    case AveragingMethod::kSync: return "sync";
    case AveragingMethod::kLocal: return fmt::format("local:period={},warmup={}", period, warmup);
    case AveragingMethod::kHier:
      return warmup ? fmt::format("hier:period={},warmup={}", period, warmup) : fmt::format("hier:period={}", period);
    case AveragingMethod::kGossip:
      return codec == "none" ? fmt::format("gossip:peers={}", peers)
                             : fmt::format("gossip:codec={},peers={}", codec, peers);
    case AveragingMethod::kAsync:
      return fmt::format("async:{}period={}{}", codec == "none" ? "" : "codec=" + codec + ",", period,
                         warmup ? fmt::format(",warmup={}", warmup) : "");
  }
  return "?";
}

int gossip_partner(int position, int n, std::int64_t round) {
  if (n < 2 || position < 0 || position >= n) return -1;
  if (n % 2 == 1) {
    const int q = static_cast<int>(((round - position) % n + n) % n);
    return q == position ? -1 : q;
  }
  // Circle method: position n-1 stays, the others turn; whoever would pair with itself takes position n-1.
  const int m = n - 1;
  const int s = static_cast<int>(round % m + m) % m;
  if (position == m) {
    for (int p = 0; p < m; ++p)
      if ((s - p + 2 * m) % m == p) return p;
    return -1;  // unreachable: m is odd, so exactly one p has 2p = s (mod m)
  }
  const int q = (s - position + 2 * m) % m;
  return q == position ? m : q;
}

}  // namespace hopwise::comm
