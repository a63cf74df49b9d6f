// The tuning file: JSON, one entry per line as written, checked field by field on reading so that every error
// names the file and the line where the bad entry starts.
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <type_traits>

#include "hopwise/comm/tuning.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

constexpr const char* kFormat = "hopwise-tuning/1";

std::string size_text(std::size_t b) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) return fmt::format("{}M", b >> 20);
  if (b >= (1u << 10) && b % (1u << 10) == 0) return fmt::format("{}K", b >> 10);
  return std::to_string(b);
}

// The line (1-based) of byte `offset` in `text`.
int line_of(const std::string& text, std::size_t offset) {
  int line = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

// Byte offsets where the elements of the top-level "entries" array start (a small scanner over strings and
// nesting: nlohmann's DOM does not keep positions).
std::vector<std::size_t> entry_offsets(const std::string& text) {
  std::vector<std::size_t> out;
  int depth = 0;
  bool in_string = false, escaped = false, in_entries = false;
  std::string last_key, current;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
        last_key = current;
      } else {
        current += ch;
      }
      continue;
    }
    switch (ch) {
      case '"':
        in_string = true;
        current.clear();
        break;
      case '{':
      case '[':
        if (in_entries && depth == 2) out.push_back(i);
        ++depth;
        if (ch == '[' && depth == 2 && last_key == "entries") in_entries = true;
        break;
      case '}':
      case ']':
        --depth;
        if (depth == 1) in_entries = false;
        break;
      default: break;
    }
  }
  return out;
}

Collective parse_collective(const std::string& s) {
  for (Collective c : {Collective::kAllreduce, Collective::kReduceScatter, Collective::kAllgather,
                       Collective::kBroadcast, Collective::kReduce, Collective::kBarrier})
    if (to_string(c) == s) return c;
  throw InvalidArgument(fmt::format(
      "unknown collective '{}'; use allreduce, reduce_scatter, allgather, broadcast, reduce or barrier", s));
}

template <class T>
T field(const nlohmann::json& j, const char* name) {
  if (!j.contains(name)) throw InvalidArgument(fmt::format("missing field \"{}\"", name));
  if constexpr (std::is_integral_v<T>) {
    // A whole number within T's range: nlohmann would convert 1e42 or -1 into a size_t by undefined behaviour
    // (found by fuzz_tuning_file).
    const nlohmann::json& v = j.at(name);
    const bool in_range = std::is_signed_v<T>
                              ? v.is_number_integer() && v.get<std::int64_t>() >= std::numeric_limits<T>::min() &&
                                    v.get<std::int64_t>() <= std::numeric_limits<T>::max()
                              : v.is_number_unsigned() && v.get<std::uint64_t>() <= std::numeric_limits<T>::max();
    if (!in_range)
      throw InvalidArgument(fmt::format("field \"{}\" must be a whole number in range, not {}", name, v.dump()));
  }
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InvalidArgument(fmt::format("field \"{}\" has the wrong type ({})", name, j.at(name).type_name()));
  }
}

TuningEntry parse_entry(const nlohmann::json& j) {
  if (!j.is_object()) throw InvalidArgument("an entry must be an object");
  TuningEntry e;
  e.collective = parse_collective(field<std::string>(j, "collective"));
  e.dtype_class = field<std::string>(j, "dtype");
  if (e.dtype_class != "float" && e.dtype_class != "half" && e.dtype_class != "int")
    throw InvalidArgument(fmt::format("unknown dtype class '{}'; use float, half or int", e.dtype_class));
  const auto max_bytes = field<std::size_t>(j, "max_bytes");
  if (max_bytes > (std::size_t{1} << 48))
    throw InvalidArgument("max_bytes is past 2^48 (256 TiB); no call is that large");
  e.size_class = size_class_of(max_bytes);
  if (size_class_max_bytes(e.size_class) != max_bytes)
    throw InvalidArgument(fmt::format("max_bytes {} is not a power of two (size classes end at 2^k bytes)", max_bytes));
  e.choice.algorithm = parse_algorithm(field<std::string>(j, "algorithm"));
  if (e.choice.algorithm == Algorithm::kAuto) throw InvalidArgument("\"algorithm\" must name an algorithm, not auto");
  if (!implements(e.choice.algorithm, e.collective))
    throw InvalidArgument(
        fmt::format("{} does not implement {}", to_string(e.choice.algorithm), to_string(e.collective)));
  e.choice.chunk_bytes = j.contains("chunk_bytes") ? field<std::size_t>(j, "chunk_bytes") : 0;
  if (e.choice.chunk_bytes != 0 && (e.choice.chunk_bytes < 64 || e.choice.chunk_bytes > (1u << 30)))
    throw InvalidArgument("chunk_bytes must be 0 (the default) or between 64 and 1G");
  e.choice.channels = j.contains("channels") ? field<int>(j, "channels") : 0;
  if (e.choice.channels != 0 && e.choice.channels != 1) throw InvalidArgument("channels must be 0 (the plan's) or 1");
  e.seconds = field<double>(j, "time_us") * 1e-6;
  if (!(e.seconds >= 0)) throw InvalidArgument("time_us must be a time in microseconds");
  if (j.contains("measured_us"))
    for (const auto& [k, v] : j.at("measured_us").items())
      e.measured.emplace_back(k, v.is_null() ? INFINITY : v.get<double>() * 1e-6);
  return e;
}

}  // namespace

std::string to_string(const TuningChoice& c) {
  std::string s(to_string(c.algorithm));
  if (c.chunk_bytes != 0) s += "/chunk=" + size_text(c.chunk_bytes);
  if (c.channels != 0) s += fmt::format("/channels={}", c.channels);
  return s;
}

int size_class_of(std::size_t bytes) { return bytes <= 1 ? 0 : static_cast<int>(std::bit_width(bytes - 1)); }
std::size_t size_class_max_bytes(int size_class) { return std::size_t{1} << size_class; }

std::string size_class_text(int size_class) {
  const std::size_t hi = size_class_max_bytes(size_class);
  return hi >= (1u << 20) ? fmt::format("{} MiB", hi >> 20)
         : hi >= 1024     ? fmt::format("{} KiB", hi >> 10)
                          : fmt::format("{} B", hi);
}

std::string dtype_class_of(DataType dt) {
  switch (dt) {
    case DataType::kFloat32:
    case DataType::kFloat64: return "float";
    case DataType::kFloat16:
    case DataType::kBFloat16: return "half";
    default: return "int";
  }
}

std::string to_string(const JobShape& s) {
  return fmt::format("{} ranks on {} host{}, {} per host", s.ranks, s.hosts, s.hosts == 1 ? "" : "s", s.ranks_per_host);
}

std::string shape_mismatch(const JobShape& made_for, const JobShape& job) {
  std::vector<std::string> diffs;
  if (made_for.ranks != job.ranks) diffs.push_back(fmt::format("ranks {} (this job {})", made_for.ranks, job.ranks));
  if (made_for.hosts != job.hosts) diffs.push_back(fmt::format("hosts {} (this job {})", made_for.hosts, job.hosts));
  if (made_for.ranks_per_host != job.ranks_per_host)
    diffs.push_back(fmt::format("ranks per host {} (this job {})", made_for.ranks_per_host, job.ranks_per_host));
  std::string s;
  for (const auto& d : diffs) s += (s.empty() ? "" : ", ") + d;
  return s;
}

std::string describe_machine() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  return fmt::format("{}, {}, {} cores", host, cpu, std::thread::hardware_concurrency());
}

std::string hopwise_version() { return HOPWISE_VERSION_TEXT; }

TuningFile read_tuning_file(const std::string& path, bool header_only) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InvalidArgument(fmt::format("HOPWISE_TUNING_FILE {}: cannot open it; make one with hopwise-tune", path));
  if (!S_ISREG(st.st_mode))
    throw InvalidArgument(fmt::format("HOPWISE_TUNING_FILE {}: not a regular file; make one with hopwise-tune", path));
  if (static_cast<std::size_t>(st.st_size) > kMaxTuningFileBytes)
    throw InvalidArgument(
        fmt::format("HOPWISE_TUNING_FILE {}: {} bytes, past the limit of {} MiB (hopwise-tune "
                    "writes a few KB); is it a tuning file?",
                    path, st.st_size, kMaxTuningFileBytes >> 20));
  std::ifstream in(path);
  if (!in)
    throw InvalidArgument(fmt::format("HOPWISE_TUNING_FILE {}: cannot open it; make one with hopwise-tune", path));
  std::string text(kMaxTuningFileBytes + 1, '\0');  // read no more than the limit, even if the file grew since
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxTuningFileBytes)
    throw InvalidArgument(
        fmt::format("HOPWISE_TUNING_FILE {}: past the limit of {} MiB", path, kMaxTuningFileBytes >> 20));
  return parse_tuning_file(text, path, header_only);
}

TuningFile parse_tuning_file(const std::string& text, const std::string& path, bool header_only) {
  auto fail = [&](std::size_t offset, const std::string& what) {
    throw InvalidArgument(fmt::format("tuning file {}, line {}: {}", path, line_of(text, offset), what));
  };
  nlohmann::json j;
  // header_only: the elements of the top-level "entries" are dropped as they are read.
  bool in_entries = false;
  const nlohmann::json::parser_callback_t skip_entries = [&](int depth, nlohmann::json::parse_event_t event,
                                                             nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::key && depth == 1) in_entries = parsed == "entries";
    return !(in_entries && depth >= 2 && event != E::array_end && event != E::key);
  };
  try {
    j = header_only ? nlohmann::json::parse(text, skip_entries) : nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(e.byte > 0 ? e.byte - 1 : 0, fmt::format("not valid JSON ({})", e.what()));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double (found by fuzzing)
    fail(0, fmt::format("not readable JSON ({})", e.what()));
  }
  TuningFile f;
  try {
    if (!j.is_object()) throw InvalidArgument("the file must hold one JSON object");
    if (field<std::string>(j, "format") != kFormat)
      throw InvalidArgument(fmt::format("format is '{}', this hopwise reads '{}'", j.at("format").dump(), kFormat));
    const auto& job = j.at("job");
    f.job = {field<int>(job, "ranks"), field<int>(job, "hosts"), field<int>(job, "ranks_per_host")};
    f.transport = j.value("transport", "");
    f.version = j.value("version", "");
    f.machine = j.value("machine", "");
    f.created = j.value("created", "");
    if (!j.contains("entries") || !j.at("entries").is_array()) throw InvalidArgument("missing array \"entries\"");
  } catch (const InvalidArgument& e) {
    fail(0, e.what());
  } catch (const nlohmann::json::exception& e) {
    fail(0, e.what());
  }
  if (header_only) return f;
  const auto offsets = entry_offsets(text);
  const auto& entries = j.at("entries");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    try {
      f.entries.push_back(parse_entry(entries[i]));
    } catch (const std::exception& e) {
      fail(i < offsets.size() ? offsets[i] : 0, fmt::format("entry {}: {}", i, e.what()));
    }
  }
  return f;
}

void write_tuning_file(const TuningFile& f, const std::string& path) {
  std::string out = "{\n";
  out += fmt::format("  \"format\": \"{}\",\n", kFormat);
  out += fmt::format("  \"version\": {},\n", nlohmann::json(f.version).dump());
  out += fmt::format("  \"machine\": {},\n", nlohmann::json(f.machine).dump());
  out += fmt::format("  \"created\": {},\n", nlohmann::json(f.created).dump());
  out += fmt::format("  \"transport\": {},\n", nlohmann::json(f.transport).dump());
  out += fmt::format("  \"job\": {{\"ranks\": {}, \"hosts\": {}, \"ranks_per_host\": {}}},\n", f.job.ranks, f.job.hosts,
                     f.job.ranks_per_host);
  out += "  \"entries\": [";
  for (std::size_t i = 0; i < f.entries.size(); ++i) {
    const TuningEntry& e = f.entries[i];
    nlohmann::ordered_json j;
    j["collective"] = std::string(to_string(e.collective));
    j["dtype"] = e.dtype_class;
    j["max_bytes"] = size_class_max_bytes(e.size_class);
    j["algorithm"] = std::string(to_string(e.choice.algorithm));
    if (e.choice.chunk_bytes) j["chunk_bytes"] = e.choice.chunk_bytes;
    if (e.choice.channels) j["channels"] = e.choice.channels;
    j["time_us"] = std::round(e.seconds * 1e7) / 10;
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : e.measured)
      m[k] = std::isfinite(v) ? nlohmann::ordered_json(std::round(v * 1e7) / 10) : nlohmann::ordered_json();
    j["measured_us"] = m;
    out += (i ? ",\n    " : "\n    ") + j.dump();
  }
  out += "\n  ]\n}\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream o(tmp);
    if (!o) throw InvalidArgument(fmt::format("cannot write the tuning file {} (is its directory there?)", tmp));
    o << out;
    if (!o.flush()) throw Error(fmt::format("writing the tuning file {} failed", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error(fmt::format("cannot rename {} to {}", tmp, path));
}

}  // namespace hopwise::comm
