// The outer path's checkpoint state (outer_state.h): a text line of settings, then length-prefixed float arrays.
#include "outer_state.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <sstream>

#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"

namespace hopwise::comm::detail {

namespace {

constexpr const char* kMagic = "hopwise-outer 1";

void put_u64(std::string& out, std::uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

void put_floats(std::string& out, const std::vector<float>& v) {
  put_u64(out, v.size());
  if (!v.empty()) out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

[[noreturn]] void refuse(const std::string& why) {
  throw InvalidArgument(fmt::format("ModelAverager::load: the outer optimizer's saved state {}", why));
}

class Reader {
 public:
  Reader(const std::string& blob, std::size_t at, std::size_t count) : blob_(blob), at_(at), count_(count) {}
  std::uint64_t u64() {
    if (blob_.size() - at_ < sizeof(std::uint64_t)) refuse("is cut short");
    std::uint64_t v;
    std::memcpy(&v, blob_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::vector<float> floats() {
    const std::uint64_t n = u64();
    if (n > count_) refuse(fmt::format("holds an array of {} values, more than the model's {}", n, count_));
    if ((blob_.size() - at_) / sizeof(float) < n) refuse("is cut short");
    std::vector<float> v(n);
    if (n > 0) std::memcpy(v.data(), blob_.data() + at_, n * sizeof(float));
    at_ += n * sizeof(float);
    return v;
  }
  bool done() const { return at_ == blob_.size(); }

 private:
  const std::string& blob_;
  std::size_t at_;
  std::size_t count_;
};

template <class T>
T field(std::istringstream& in, const char* name) {
  std::string text;
  in >> text;
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    refuse(fmt::format("has {} '{}', not a number", name, text.substr(0, 40)));
  return v;
}

}  // namespace

std::string OuterSettings::to_string() const {
  return fmt::format("period={},fragments={},delay={},codec={},outer_lr={},momentum={},nesterov={},alpha={}", period,
                     fragments, delay, codec, lr, momentum, nesterov ? 1 : 0, alpha);
}

std::string write_outer_state(const OuterState& s) {
  const OuterSettings& o = s.settings;
  std::string out = fmt::format("{}\n{} {} {} {} {} {} {} {} {} {}\n", kMagic, o.period, o.warmup, o.lr, o.momentum,
                                o.nesterov ? 1 : 0, o.fragments, o.delay, o.alpha, o.codec, s.picking ? 1 : 0);
  put_u64(out, s.why.size());
  out += s.why;
  put_floats(out, s.synced);
  put_floats(out, s.momentum);
  put_u64(out, s.codecs.size());
  for (const auto& c : s.codecs) {
    put_u64(out, c.step);
    put_floats(out, c.residual);
  }
  put_u64(out, s.flight ? 1 : 0);
  if (s.flight) {
    put_u64(out, static_cast<std::uint64_t>(s.flight->fragment));
    put_u64(out, static_cast<std::uint64_t>(s.flight->launched_at));
    put_floats(out, s.flight->sent);
    put_floats(out, s.flight->averaged);
  }
  return out;
}

OuterState read_outer_state(const std::string& blob, const AveragingSpec& spec, std::size_t count) {
  const auto first = blob.find('\n');
  if (first == std::string::npos || blob.compare(0, first, kMagic) != 0)
    refuse(fmt::format("does not begin with '{}'", kMagic));
  const auto second = blob.find('\n', first + 1);
  if (second == std::string::npos || second - first > 256) refuse("has no settings line");
  std::istringstream line(blob.substr(first + 1, second - first - 1));
  OuterState s;
  OuterSettings& o = s.settings;
  o.period = field<int>(line, "period");
  o.warmup = field<int>(line, "warmup");
  o.lr = field<double>(line, "outer_lr");
  o.momentum = field<double>(line, "momentum");
  o.nesterov = field<int>(line, "nesterov") != 0;
  o.fragments = field<int>(line, "fragments");
  o.delay = field<int>(line, "delay");
  o.alpha = field<double>(line, "alpha");
  line >> o.codec;
  s.picking = field<int>(line, "picking") != 0;
  const auto codecs = compression::known_codecs();
  const bool ok = o.period >= 1 && o.warmup >= 0 && o.lr > 0 && o.lr <= 10 && o.momentum >= 0 && o.momentum < 1 &&
                  o.fragments >= 1 && o.fragments <= 1024 && o.period % o.fragments == 0 && o.delay >= 0 &&
                  o.delay <= o.period / o.fragments && o.alpha >= 0 && o.alpha <= 1 &&
                  std::find(codecs.begin(), codecs.end(), o.codec) != codecs.end();
  if (!ok) refuse(fmt::format("has settings out of range ({})", o.to_string()));
  if (!spec.pick && (o.period != spec.period || o.fragments != spec.fragments || o.codec != spec.codec))
    refuse(fmt::format("was taken with {}, not this spec's", o.to_string()));
  Reader in(blob, second + 1, count);
  const std::uint64_t why = in.u64();
  if (why > 4096 || blob.size() - (second + 1 + 8) < why) refuse("has a choice text longer than 4 KiB or cut short");
  s.why = blob.substr(second + 1 + 8, why);
  Reader rest(blob, second + 1 + 8 + why, count);
  s.synced = rest.floats();
  s.momentum = rest.floats();
  const std::uint64_t parts = rest.u64();
  if (parts > static_cast<std::uint64_t>(o.fragments)) refuse("has more codec states than fragments");
  for (std::uint64_t i = 0; i < parts; ++i) {
    OuterState::CodecPart c;
    c.step = rest.u64();
    c.residual = rest.floats();
    s.codecs.push_back(std::move(c));
  }
  if (const std::uint64_t flying = rest.u64(); flying > 1) {
    refuse("has a flag that is not 0 or 1");
  } else if (flying == 1) {
    OuterState::InFlight f;
    const std::uint64_t frag = rest.u64();
    const std::uint64_t at = rest.u64();
    if (frag >= static_cast<std::uint64_t>(o.fragments) || at > (1ull << 40))
      refuse("has a fragment in flight out of range");
    f.fragment = static_cast<int>(frag);
    f.launched_at = static_cast<std::int64_t>(at);
    f.sent = rest.floats();
    f.averaged = rest.floats();
    s.flight = std::move(f);
  }
  if (!rest.done()) refuse("has bytes after its end");
  return s;
}

}  // namespace hopwise::comm::detail
