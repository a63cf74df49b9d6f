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
#include "outer_rule.h"

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

// A decimal number in [lo, hi] (open at either end where the flag says so).
double number(const std::string& spec, const std::string& field, const std::string& value, double lo, double hi,
              bool lo_open, bool hi_open, const char* what) {
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  const bool ok = ec == std::errc() && end == value.data() + value.size() && (lo_open ? v > lo : v >= lo) &&
                  (hi_open ? v < hi : v <= hi);
  if (!ok)
    throw InvalidArgument(fmt::format("averaging '{}': {}={} must be a number in {}{}, {}{} ({})", spec, field, value,
                                      lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']', what));
  return v;
}

std::string shortest(double v) { return fmt::format("{}", v); }

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
    {"alpha",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.alpha = number(text, "alpha", v, 0, 1, false, false, "the share of the local model kept at a merge");
     },
     [](const AveragingSpec& s) { return shortest(s.alpha); }},
    {"auto", [](AveragingSpec& s, const std::string&, const std::string&) { s.pick = 1; },
     [](const AveragingSpec& s) { return std::to_string(s.pick); }},
    {"codec",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       const auto row = find_averaging_method(s.method);
       if (row && row->any_codec) {
         const auto all = compression::known_codecs();
         if (!has(all, v))
           throw InvalidArgument(
               fmt::format("averaging '{}': codec={} is not a codec; use {} (their defaults, error "
                           "feedback on)",
                           text, v, fmt::join(all, ", ")));
         s.codec = v;
         return;
       }
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
    {"fragments",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.fragments = whole(text, "fragments", v, 1, "fragments synced in turn");
       if (s.fragments > 1024)
         throw InvalidArgument(fmt::format("averaging '{}': fragments={} is more than 1024", text, v));
     },
     [](const AveragingSpec& s) { return std::to_string(s.fragments); }},
    {"inner",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       if (!has(detail::inner_families(), v))
         throw InvalidArgument(
             fmt::format("averaging '{}': inner={} is not {} (the trainer's optimizer family: adam for Adam, AdamW, "
                         "NAdam, RAdam, Adamax and Adagrad; leave it out for another optimizer: the conservative "
                         "outer step)",
                         text, v, fmt::join(detail::inner_families(), ", ")));
       s.inner = v;
     },
     [](const AveragingSpec& s) { return s.inner; }},
    {"momentum",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.momentum = number(text, "momentum", v, 0, 1, false, true, "the outer SGD's momentum");
     },
     [](const AveragingSpec& s) { return shortest(s.momentum); }},
    {"nesterov",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       if (v != "0" && v != "1")
         throw InvalidArgument(fmt::format("averaging '{}': nesterov={} is not 0 or 1", text, v));
       s.nesterov = v == "1";
     },
     [](const AveragingSpec& s) { return std::to_string(s.nesterov); }},
    {"outer_lr",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.outer_lr = number(text, "outer_lr", v, 0, 10, true, false, "the outer SGD's learning rate");
     },
     [](const AveragingSpec& s) { return shortest(s.outer_lr); }},
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
    {"target",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.target = number(text, "target", v, 0, 1, true, true, "the compute utilization auto keeps");
     },
     [](const AveragingSpec& s) { return shortest(s.target); }},
    {"warmup",
     [](AveragingSpec& s, const std::string& text, const std::string& v) {
       s.warmup = whole(text, "warmup", v, 0, "synchronous steps first");
     },
     [](const AveragingSpec& s) { return std::to_string(s.warmup); }},
};

// "diloco:auto,target=0.9" reads auto as a field without a value: the spec parser takes key=value only.
std::string with_bare_auto(const std::string& text) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) return text;
  std::string out = text.substr(0, colon + 1);
  std::string_view rest(text);
  rest.remove_prefix(colon + 1);
  for (bool first = true; !rest.empty() || first; first = false) {
    const auto comma = rest.find(',');
    std::string item(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item == "auto") item = "auto=1";
    out += (first ? "" : ",") + item;
    if (comma != std::string_view::npos && rest.empty()) out += ",";  // the parser names the trailing comma
  }
  return out;
}

const Field* find_field(const std::string& name) {
  for (const Field& f : kFields)
    if (name == f.name) return &f;
  return nullptr;
}

// What the fields allow together: a fragment's average is applied before the next is launched, auto picks what it
// picks, and auto's own fields go with it.
void check_combination(AveragingSpec& s, const AveragingMethodRow& row, const compression::CodecSpec& parsed,
                       const std::string& text) {
  if (row.delay_up_to_period) {
    if (s.delay > s.period)
      throw InvalidArgument(
          fmt::format("averaging '{}': delay={} is past period={}: an average must be applied before "
                      "the next snapshot is taken; use delay=1..{}",
                      text, s.delay, s.period, s.period));
    if (s.delay == s.period) s.delay = 0;  // the default: one spelling per spec
    return;
  }
  if (s.pick) {
    for (const char* f : {"period", "fragments", "delay", "codec", "outer_lr", "momentum", "nesterov", "alpha"})
      if (parsed.params.count(f))
        throw InvalidArgument(
            fmt::format("averaging '{}': {}:auto picks {} itself; drop it, or drop auto and give period= and the rest",
                        text, s.method, f));
    return;
  }
  if (parsed.params.count("target"))
    throw InvalidArgument(
        fmt::format("averaging '{}': target= goes with {}:auto (the utilization auto aims at)", text, s.method));
  // No outer step named: the measured one for the inner optimizer and the period (outer_rule.h).
  if (s.method == "diloco" && !parsed.params.count("outer_lr") && !parsed.params.count("momentum") &&
      !parsed.params.count("nesterov")) {
    const detail::OuterStep rule = detail::outer_rule(s.inner, s.period);
    s.outer_lr = rule.lr;
    s.momentum = rule.momentum;
    s.nesterov = rule.nesterov ? 1 : 0;
    s.outer_by_rule = true;
  }
  if (s.period % s.fragments != 0)
    throw InvalidArgument(fmt::format(
        "averaging '{}': period={} is not a multiple of fragments={}: one fragment is synced every period / "
        "fragments steps",
        text, s.period, s.fragments));
  if (const int gap = s.period / s.fragments; s.delay > gap)
    throw InvalidArgument(fmt::format(
        "averaging '{}': delay={} is past the {} steps between two fragments' syncs: a fragment's average is applied "
        "before the next is launched; use delay=0..{}",
        text, s.delay, gap, gap));
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
    parsed = compression::parse_codec_spec(with_bare_auto(text));
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
  if (auto a = parsed.params.find("auto"); a != parsed.params.end() && a->second != "1")
    throw InvalidArgument(fmt::format("averaging '{}': auto takes no value (write {}:auto)", text, row->name));
  const bool pick = parsed.params.count("auto") > 0;
  for (const std::string& f : row->required)
    if (!pick && !parsed.params.count(f))
      throw InvalidArgument(fmt::format("averaging '{}': {} needs {}=H, the steps between averagings (e.g. {}:{}=8)",
                                        text, row->name, f, row->name, f));
  AveragingSpec s;
  s.method = row->name;
  for (const auto& [k, v] : parsed.params) find_field(k)->read(s, text, v);  // rows name only kFields (checked)
  check_combination(s, *row, parsed, text);
  return s;
}

// The name, then in name order every field the row shows always or that differs from its default.
std::string AveragingSpec::to_string() const {
  const bool pick = this->pick != 0;
  const auto row = find_averaging_method(method);
  if (!row) return method;
  AveragingSpec defaults;
  defaults.method = method;
  // auto's picks are not the spec's: "diloco:auto" stays that after the averager has chosen
  const std::vector<std::string> picked = {"period",   "fragments", "delay",    "codec",
                                           "outer_lr", "momentum",  "nesterov", "alpha"};
  const std::vector<std::string> by_rule = {"outer_lr", "momentum", "nesterov"};
  std::vector<std::string> parts;
  for (const Field& f : kFields) {
    const std::string value = f.write(*this);
    if (!has(row->fields, f.name) || (value == f.write(defaults) && !has(row->shown, f.name))) continue;
    if (std::string_view(f.name) == "auto")
      parts.emplace_back("auto");
    else if ((!pick || !has(picked, f.name)) && !(outer_by_rule && has(by_rule, f.name)))
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
