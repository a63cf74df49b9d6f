// Averaging specs ("local:period=8,warmup=100"), read and written by the methods' rows, and gossip's pairing
// schedule: pure functions, shared by the C++ averager, train_mnist and the PyTorch frontend's averagers.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/spec.h"
#include "hopwise/training/averaging.h"
#include "hopwise/training/averaging_method.h"

namespace hopwise::comm {

namespace {

int whole(const std::string& spec, const std::string& field, const std::string& value, int lowest, const char* what) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < lowest)
    throw InvalidArgument(
        fmt::format("averaging '{}': {}={} must be a whole number >= {} ({})", spec, field, value, lowest, what));
  return v;
}

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// AveragingSpec's fields, each once: how it is read from a spec and written back. Rows name fields from here.
struct Field {
  const char* name;
  void (*read)(AveragingSpec& s, const std::string& text, const std::string& value);
  std::string (*write)(const AveragingSpec& s);
};

const Field kFields[] = {
    {"codec",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       const auto& fit = compression::codecs_for_models();
       if (!has(fit, v))
         throw InvalidArgument(
             fmt::format("averaging '{}': codec={} is not one {} sends; use {} (model differences: a codec that "
                         "keeps every element)",
                         text, v, s.method, fmt::join(fit, ", ")));
       s.codec = v;
     },
     [](const AveragingSpec& s) { return s.codec; }},
    {"delay",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.delay = whole(text, "delay", v, 1, "steps from a snapshot to applying its average");
     },
     [](const AveragingSpec& s) { return std::to_string(s.delay); }},
    {"peers",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.peers = whole(text, "peers", v, 1, "partners per step");
       // Each partner of a step takes a message tag of gossip's reserved range (the exchange and the simulator).
       if (const int most = reserved_tags("gossip").count; s.peers > most)
         throw InvalidArgument(
             fmt::format("averaging '{}': peers={} is more partners per step than gossip has tags for ({} at most)",
                         text, v, most));
     },
     [](const AveragingSpec& s) { return std::to_string(s.peers); }},
    {"period",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.period = whole(text, "period", v, 1, "steps between averagings");
     },
     [](const AveragingSpec& s) { return std::to_string(s.period); }},
    {"warmup",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.warmup = whole(text, "warmup", v, 0, "synchronous steps first");
     },
     [](const AveragingSpec& s) { return std::to_string(s.warmup); }},
};

const Field* find_field(const std::string& name) {
  for (const Field& f : kFields)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

std::vector<std::string> averaging_spec_fields() {
  std::vector<std::string> names;
  for (const Field& f : kFields) names.emplace_back(f.name);
  return names;
}

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
  const auto row = find_averaging_method(parsed.name);
  if (!row)
    throw InvalidArgument(fmt::format("averaging method '{}' is unknown; methods: {} (e.g. local:period=8)",
                                      parsed.name, fmt::join(averaging_method_names(), ", ")));
  for (const auto& [k, v] : parsed.params)
    if (!has(row->fields, k))
      throw InvalidArgument(
          row->fields.empty()
              ? fmt::format("averaging '{}': {} takes no fields (got {})", text, row->name, k)
              : fmt::format("averaging '{}': {} takes {}, not {}", text, row->name, fmt::join(row->fields, ", "), k));
  for (const std::string& f : row->required)
    if (!parsed.params.count(f))
      throw InvalidArgument(fmt::format("averaging '{}': {} needs {}=H, the steps between averagings (e.g. {}:{}=8)",
                                        text, row->name, f, row->name, f));
  AveragingSpec s;
  s.method = row->name;
  for (const auto& [k, v] : parsed.params) find_field(k)->read(s, text, v);  // rows name only kFields (checked)
  if (s.delay > s.period)
    throw InvalidArgument(
        fmt::format("averaging '{}': delay={} is past period={}: an average must be applied before "
                    "the next snapshot is taken; use delay=1..{}",
                    text, s.delay, s.period, s.period));
  if (s.delay == s.period) s.delay = 0;  // the default: one spelling per spec
  return s;
}

// The name, then in name order every field the row shows always or that differs from its default.
std::string AveragingSpec::to_string() const {
  const auto row = find_averaging_method(method);
  if (!row) return method;
  AveragingSpec defaults;
  defaults.method = method;
  std::vector<std::string> parts;
  for (const Field& f : kFields) {
    const std::string value = f.write(*this);
    if (has(row->fields, f.name) && (value != f.write(defaults) || has(row->shown, f.name)))
      parts.push_back(fmt::format("{}={}", f.name, value));
  }
  return parts.empty() ? method : fmt::format("{}:{}", method, fmt::join(parts, ","));
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
