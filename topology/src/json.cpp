// hopwise's own JSON topology format: the writer (to_json) and the reader (parse_json), which share the schema's
// name and version.
#include "hopwise/topology/formats.h"

#include <fmt/core.h>

#include <algorithm>
#include <climits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "hopwise/common/error.h"

namespace hopwise::topology {

namespace {
constexpr const char* kSchema = "hopwise-topology";
constexpr int kSchemaVersion = 1;
}  // namespace

std::string to_json(const Topology& t) {
  nlohmann::json j;
  j["schema"] = kSchema;
  j["version"] = kSchemaVersion;
  j["source_format"] = t.source_format;
  j["source_name"] = t.source_name;
  auto& nodes = j["nodes"] = nlohmann::json::array();
  for (const auto& n : t.nodes()) {
    nlohmann::json o;
    o["id"] = n.id;
    o["kind"] = std::string(to_string(n.kind));
    o["name"] = n.name;
    o["pci_bus_id"] = n.pci_bus_id;
    o["numa"] = n.numa;
    o["index"] = n.index;
    o["cpu_affinity"] = n.cpu_affinity;
    o["model"] = n.model;
    o["speed_gbps"] = n.speed_gbps;
    o["host_bridge"] = n.host_bridge;
    o["attrs"] = n.attrs;
    nodes.push_back(std::move(o));
  }
  auto& links = j["links"] = nlohmann::json::array();
  for (const auto& l : t.links()) {
    links.push_back({{"a", l.a},
                     {"b", l.b},
                     {"kind", std::string(to_string(l.kind))},
                     {"count", l.count},
                     {"pcie_gen", l.pcie_gen},
                     {"pcie_width", l.pcie_width},
                     {"bandwidth_gbps", l.bandwidth_gbps},
                     {"latency_us", l.latency_us}});
    if (l.assumed) links.back()["assumed"] = true;  // written only when set: older files stay byte-identical
  }
  auto& decl = j["declared_paths"] = nlohmann::json::array();
  for (const auto& [k, c] : t.declared_path_classes())
    if (k.first < k.second) decl.push_back({k.first, k.second, std::string(to_string(c))});
  // Readers keep names and attributes byte for byte, and XML or nvidia-smi text need not be UTF-8; JSON must be, so
  // invalid sequences are written as U+FFFD instead of throwing nlohmann's type_error from a writer.
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Topology parse_json(std::string_view text, const std::string& src) {
  {
    // Nesting limit before handing the text to nlohmann (the schema needs depth 4).
    int depth = 0, line = 1;
    bool in_str = false;
    for (std::size_t k = 0; k < text.size(); ++k) {
      const char c = text[k];
      if (c == '\n') ++line;
      if (in_str) {
        if (c == '\\')
          ++k;
        else if (c == '"')
          in_str = false;
      } else if (c == '"') {
        in_str = true;
      } else if (c == '[' || c == '{') {
        if (++depth > kMaxXmlDepth)
          throw InvalidArgument(
              fmt::format("{}:{}: JSON nests deeper than the limit of {} levels", src, line, kMaxXmlDepth));
      } else if (c == ']' || c == '}') {
        --depth;
      }
    }
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), nullptr, true, false);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann reports a byte offset; turn it into a line.
    const std::size_t off = std::min<std::size_t>(e.byte, text.size());
    const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(off), '\n'));
    throw InvalidArgument(
        fmt::format("{}:{}: invalid JSON ({}); expected a hopwise-topology document", src, line, e.what()));
  } catch (const nlohmann::json::exception& e) {
    // out_of_range.406, a number beyond double ("1e400"), carries no offset: find the number it quotes.
    const std::string w = e.what();
    const auto q = w.find('\''), q2 = w.rfind('\'');
    const std::size_t off = q < q2 ? text.find(w.substr(q + 1, q2 - q - 1)) : std::string_view::npos;
    const int line = off == std::string_view::npos
                         ? 1
                         : 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(off), '\n'));
    throw InvalidArgument(
        fmt::format("{}:{}: invalid JSON ({}); expected a hopwise-topology document", src, line, e.what()));
  }
  auto bad = [&](const std::string& what) -> InvalidArgument {
    return InvalidArgument(fmt::format("{}:1: {}", src, what));
  };
  // nlohmann's get<int>() is a plain cast: 1e20 or 2^63 would be undefined behaviour, 3.5 silently 3.
  auto get_int = [&](const nlohmann::json& v) -> int {
    if (v.is_number_integer() && !v.is_number_unsigned() && v.get<long long>() >= INT_MIN &&
        v.get<long long>() <= INT_MAX)
      return static_cast<int>(v.get<long long>());
    if (v.is_number_unsigned() && v.get<unsigned long long>() <= INT_MAX)
      return static_cast<int>(v.get<unsigned long long>());
    throw bad(fmt::format("expected an integer from {} to {}, found {}", INT_MIN, INT_MAX, v.dump().substr(0, 40)));
  };
  try {
    if (!j.is_object() || j.value("schema", "") != kSchema)
      throw bad(fmt::format("expected a JSON object with \"schema\": \"{}\"", kSchema));
    if (get_int(j.at("version")) != kSchemaVersion)
      throw bad(fmt::format("unsupported schema version {}; expected {}", j.at("version").dump(), kSchemaVersion));
    Topology t;
    t.source_format = j.at("source_format").get<std::string>();
    t.source_name = j.at("source_name").get<std::string>();
    const auto& nodes = j.at("nodes");
    if (nodes.size() > static_cast<std::size_t>(kMaxNodes)) throw bad("too many nodes");
    for (const auto& o : nodes) {
      Node n;
      n.kind = node_kind_from_string(o.at("kind").get<std::string>());
      n.name = o.at("name").get<std::string>();
      n.pci_bus_id = o.at("pci_bus_id").get<std::string>();
      n.numa = get_int(o.at("numa"));
      n.index = get_int(o.at("index"));
      n.cpu_affinity = o.at("cpu_affinity").get<std::string>();
      n.model = o.at("model").get<std::string>();
      n.speed_gbps = o.at("speed_gbps").get<double>();
      n.host_bridge = o.at("host_bridge").get<bool>();
      n.attrs = o.at("attrs").get<std::map<std::string, std::string>>();
      const int want = get_int(o.at("id"));
      if (t.add_node(std::move(n)) != want)
        throw bad(fmt::format("node ids must be 0, 1, 2... in order; found {}", want));
    }
    for (const auto& o : j.at("links")) {
      Link l;
      l.a = get_int(o.at("a"));
      l.b = get_int(o.at("b"));
      l.kind = link_kind_from_string(o.at("kind").get<std::string>());
      l.count = get_int(o.at("count"));
      l.pcie_gen = get_int(o.at("pcie_gen"));
      l.pcie_width = get_int(o.at("pcie_width"));
      l.bandwidth_gbps = o.at("bandwidth_gbps").get<double>();
      l.latency_us = o.at("latency_us").get<double>();
      l.assumed = o.contains("assumed") && o.at("assumed").get<bool>();
      t.add_link(l);
    }
    for (const auto& d : j.at("declared_paths"))
      t.declare_path_class(get_int(d.at(0)), get_int(d.at(1)), path_class_from_string(d.at(2).get<std::string>()));
    return t;
  } catch (const nlohmann::json::exception& e) {
    throw bad(fmt::format("malformed hopwise-topology JSON ({}); expected the fields that to_json writes", e.what()));
  } catch (const InvalidArgument& e) {
    const std::string w = e.what();
    if (w.rfind(src + ":", 0) == 0) throw;
    throw bad(w);
  }
}

}  // namespace hopwise::topology
