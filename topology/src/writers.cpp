// Writers (JSON, NCCL topology XML, Graphviz DOT) and the JSON reader.
#include <fmt/core.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "hopwise/common/error.h"
#include "hopwise/topology/formats.h"

namespace hopwise::topology {

namespace {
constexpr const char* kSchema = "hopwise-topology";
constexpr int kSchemaVersion = 1;
}  // namespace

// ---------------------------------------------------------------------------------------------- JSON

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

// ---------------------------------------------------------------------------------------------- NCCL XML

namespace {

std::string xml_value(std::string v) {
  // NCCL's parser decodes no entities: drop characters it can not carry instead.
  v.erase(std::remove_if(v.begin(), v.end(),
                         [](char c) {
                           return c == '"' || c == '<' || c == '>' || c == '\n' || c == '\r' || c == '\t' || c == '&';
                         }),
          v.end());
  if (v.size() > 255) v.resize(255);
  return v;
}

struct Tag {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  void add(const std::string& k, const std::string& v) {
    if (attrs.size() < 16) attrs.emplace_back(k, xml_value(v));
  }
  std::string open(int indent, bool self_close) const {
    std::string s(static_cast<std::size_t>(indent) * 2, ' ');
    s += "<" + name;
    for (const auto& [k, v] : attrs) s += " " + k + "=\"" + v + "\"";
    s += self_close ? "/>\n" : ">\n";
    return s;
  }
};

// A figure as a whole number; clamped, because a model read from JSON may carry 1e300 and the cast would be undefined.
std::string whole_number(double x) {
  constexpr double kMax = 9.2e18;  // just inside long long
  if (!(x > -kMax && x < kMax)) x = x < 0 ? -kMax : kMax;
  return std::to_string(static_cast<long long>(x));
}

std::string link_speed_string(int gen) {
  static const char* s[] = {
      "", "2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe"};
  return gen >= 1 && gen <= 6 ? s[gen] : "";
}

}  // namespace

std::string to_nccl_xml(const Topology& t) {
  // Bus ids for nodes that lack one (NCCL requires busid on <pci>): ffff:fX:YY.0 placeholders as the cloud files use.
  std::vector<std::string> bus(t.nodes().size());
  int fake = 0;
  for (const auto& n : t.nodes()) {
    bus[static_cast<std::size_t>(n.id)] =
        !n.pci_bus_id.empty() ? n.pci_bus_id : fmt::format("ffff:{:02x}:{:02x}.0", 0xf0 + (fake / 32) % 16, fake % 32);
    if (n.pci_bus_id.empty() && n.kind != NodeKind::Host && n.kind != NodeKind::Numa) ++fake;
  }
  auto cls_of = [&](const Node& n) -> std::string {
    if (auto it = n.attrs.find("class"); it != n.attrs.end() && it->second.size() >= 4) return it->second;
    switch (n.kind) {
      case NodeKind::Gpu:
        return "0x030200";
      case NodeKind::Nic:
        return "0x020700";
      case NodeKind::NvSwitch:
        return "0x068000";
      default:
        return "0x060400";
    }
  };
  std::vector<char> done(t.nodes().size(), 0);
  std::string out = "<system version=\"1\">\n";
  std::function<void(int, int, const Link*)> emit = [&](int id, int indent, const Link* up) {
    if (indent > kMaxXmlDepth)
      throw InvalidArgument(
          fmt::format("the PCI tree below node '{}' is deeper than {} levels; NCCL XML can not "
                      "carry it",
                      t.node(id).name, kMaxXmlDepth));
    done[static_cast<std::size_t>(id)] = 1;
    const Node& n = t.node(id);
    // Host bridges are not NCCL nodes: their children go straight under the parent.
    std::vector<std::pair<int, const Link*>> kids;
    for (int li : t.links_of(id)) {
      const Link& l = t.links()[static_cast<std::size_t>(li)];
      const int o = l.a == id ? l.b : l.a;
      if (l.kind != LinkKind::PCIe || done[static_cast<std::size_t>(o)]) continue;
      const NodeKind k = t.node(o).kind;
      // NVSwitches are not written as PCI devices: NCCL builds its NVS node from the GPUs' <nvlink tclass="0x068000">.
      if (k == NodeKind::Host || k == NodeKind::Numa || k == NodeKind::CpuPackage || k == NodeKind::Network ||
          k == NodeKind::NvSwitch)
        continue;
      kids.emplace_back(o, &l);
    }
    if (n.kind == NodeKind::PciSwitch && n.host_bridge) {
      for (auto& [o, l] : kids)
        if (!done[static_cast<std::size_t>(o)]) emit(o, indent, l);
      return;
    }
    const bool bare_nic = n.kind == NodeKind::Nic && n.pci_bus_id.empty() && kids.empty();
    if (bare_nic) {
      out += std::string(static_cast<std::size_t>(indent) * 2, ' ') + "<nic>\n";
    } else {
      Tag p{"pci", {}};
      p.add("busid", bus[static_cast<std::size_t>(id)]);
      p.add("class", cls_of(n));
      for (const char* k : {"vendor", "device", "subsystem_vendor", "subsystem_device"})
        p.add(k, n.attrs.count(k) ? n.attrs.at(k) : "0xffff");
      const int gen = up ? up->pcie_gen : 0;
      p.add("link_speed", gen ? link_speed_string(gen) : (n.attrs.count("link_speed") ? n.attrs.at("link_speed") : ""));
      p.add("link_width", std::to_string(up && up->pcie_width ? up->pcie_width : 16));
      const bool has_body = n.kind == NodeKind::Gpu || n.kind == NodeKind::Nic || !kids.empty();
      out += p.open(indent, !has_body);
      if (!has_body) return;
      for (auto& [o, l] : kids)
        if (!done[static_cast<std::size_t>(o)]) emit(o, indent + 1, l);
      if (n.kind == NodeKind::Gpu) {
        Tag g{"gpu", {}};
        g.add("dev", std::to_string(n.index >= 0 ? n.index : 0));
        g.add("sm", n.attrs.count("sm") ? n.attrs.at("sm") : "80");
        g.add("rank", n.attrs.count("rank") ? n.attrs.at("rank") : std::to_string(std::max(n.index, 0)));
        g.add("gdr", n.attrs.count("gdr") ? n.attrs.at("gdr") : "1");
        std::vector<Tag> nv;
        for (int li : t.links_of(id)) {
          const Link& l = t.links()[static_cast<std::size_t>(li)];
          if (l.kind != LinkKind::NVLink && l.kind != LinkKind::C2C) continue;
          const Node& o = t.node(l.a == id ? l.b : l.a);
          if (l.kind == LinkKind::C2C) {
            Tag c{"c2c", {}};
            c.add("bw", whole_number(l.bandwidth_gbps * 1000 / std::max(l.count, 1)));
            c.add("count", std::to_string(l.count));
            nv.push_back(c);
            continue;
          }
          Tag v{"nvlink", {}};
          v.add("target", o.kind == NodeKind::NvSwitch && o.pci_bus_id.empty() ? "fffffff:ff:ff.0"
                                                                               : bus[static_cast<std::size_t>(o.id)]);
          v.add("count", std::to_string(std::max(l.count, 1)));
          v.add("tclass", o.kind == NodeKind::Gpu        ? "0x030200"
                          : o.kind == NodeKind::NvSwitch ? "0x068000"
                                                         : "0x068001");
          nv.push_back(v);
        }
        out += g.open(indent + 1, nv.empty());
        if (!nv.empty()) {
          for (const auto& v : nv) out += v.open(indent + 2, true);
          out += std::string(static_cast<std::size_t>(indent + 1) * 2, ' ') + "</gpu>\n";
        }
      }
      if (n.kind != NodeKind::Nic) {
        out += std::string(static_cast<std::size_t>(indent) * 2, ' ') + "</pci>\n";
        return;
      }
      out += std::string(static_cast<std::size_t>(indent + 1) * 2, ' ') + "<nic>\n";
      ++indent;
    }
    // NIC body.
    std::string ports = n.attrs.count("ports") ? n.attrs.at("ports") : n.name;
    std::vector<std::string> names;
    for (std::size_t b = 0;;) {
      const auto e = ports.find(',', b);
      names.push_back(ports.substr(b, e == std::string::npos ? std::string::npos : e - b));
      if (e == std::string::npos) break;
      b = e + 1;
    }
    for (std::size_t k = 0; k < names.size(); ++k) {
      Tag net{"net", {}};
      net.add("name", names[k]);
      net.add("dev", std::to_string(std::max(n.index, 0) + static_cast<long long>(k)));  // index may be INT_MAX
      const double per_port = names.empty() ? n.speed_gbps : n.speed_gbps / static_cast<double>(names.size());
      net.add("speed", whole_number(per_port > 0 ? per_port * 1000 : 100000));
      net.add("port", n.attrs.count("port") ? n.attrs.at("port") : "1");
      if (n.attrs.count("guid")) net.add("guid", n.attrs.at("guid"));
      net.add("gdr", n.attrs.count("gdr") ? n.attrs.at("gdr") : "0");
      out += net.open(indent + 1, true);
    }
    out += std::string(static_cast<std::size_t>(indent) * 2, ' ') + "</nic>\n";
    if (!bare_nic) out += std::string(static_cast<std::size_t>(indent - 1) * 2, ' ') + "</pci>\n";
  };
  // One <cpu> per NUMA node; I/O attached to a package or host goes to the first NUMA node below it.
  std::vector<int> numas = t.nodes_of(NodeKind::Numa);
  auto numa_for = [&](int cpu_side) -> int {
    const Node& c = t.node(cpu_side);
    if (c.kind == NodeKind::Numa) return cpu_side;
    for (int id : numas)
      if (c.numa >= 0 && t.node(id).index == c.numa) return id;
    for (int li : t.links_of(cpu_side)) {
      const Link& l = t.links()[static_cast<std::size_t>(li)];
      const int o = l.a == cpu_side ? l.b : l.a;
      if (l.kind == LinkKind::Internal && t.node(o).kind == NodeKind::Numa) return o;
    }
    return numas.empty() ? -1 : numas.front();
  };
  std::map<int, std::vector<std::pair<int, const Link*>>> roots;  // numa id (-1 none) -> attached I/O
  for (const auto& l : t.links()) {
    if (l.kind != LinkKind::PCIe) continue;
    for (auto [c, d] : {std::pair{l.a, l.b}, std::pair{l.b, l.a}}) {
      const NodeKind ck = t.node(c).kind, dk = t.node(d).kind;
      const bool c_cpu = ck == NodeKind::Host || ck == NodeKind::CpuPackage || ck == NodeKind::Numa;
      const bool d_cpu = dk == NodeKind::Host || dk == NodeKind::CpuPackage || dk == NodeKind::Numa;
      if (c_cpu && !d_cpu && dk != NodeKind::NvSwitch) roots[numa_for(c)].emplace_back(d, &l);
    }
  }
  std::vector<int> cpu_ids = numas;
  if (cpu_ids.empty()) cpu_ids.push_back(-1);
  for (int c : cpu_ids) {
    Tag cpu{"cpu", {}};
    const Node* cn = c >= 0 ? &t.node(c) : nullptr;
    auto attr = [&](const char* k, const std::string& dflt) {
      return cn && cn->attrs.count(k) ? cn->attrs.at(k) : dflt;
    };
    cpu.add("numaid", std::to_string(cn ? cn->index : 0));
    if (cn && cn->attrs.count("affinity")) cpu.add("affinity", cn->attrs.at("affinity"));
    cpu.add("arch", attr("arch", "x86_64"));
    cpu.add("vendor", attr("vendor", "GenuineIntel"));
    cpu.add("familyid", attr("familyid", "6"));
    cpu.add("modelid", attr("modelid", "85"));
    const auto& rs = roots[c];
    out += cpu.open(1, rs.empty());
    if (rs.empty()) continue;
    for (const auto& [d, l] : rs)
      if (!done[static_cast<std::size_t>(d)]) emit(d, 2, l);
    out += "  </cpu>\n";
  }
  out += "</system>\n";
  return out;
}

// ---------------------------------------------------------------------------------------------- DOT

std::string to_dot(const Topology& t) {
  auto esc = [](const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      o += c;
    }
    return o;
  };
  std::string out = "graph topology {\n  node [shape=box];\n";
  for (const auto& n : t.nodes()) {
    std::string label = n.name;
    if (!n.pci_bus_id.empty() && n.name.find(n.pci_bus_id) == std::string::npos) label += "\\n" + n.pci_bus_id;
    if (!n.model.empty()) label += "\\n" + esc(n.model);
    out += fmt::format("  n{} [label=\"{}\", kind=\"{}\"];\n", n.id, esc(n.name) + label.substr(n.name.size()),
                       to_string(n.kind));
  }
  for (const auto& l : t.links()) {
    std::string label(to_string(l.kind));
    if (l.kind == LinkKind::NVLink) label = fmt::format("NV{}", l.count);
    if (l.kind == LinkKind::PCIe && l.pcie_gen) label = fmt::format("PCIe{}x{}", l.pcie_gen, l.pcie_width);
    if (l.bandwidth_gbps > 0) label += fmt::format(" {:.1f}GB/s", l.bandwidth_gbps);
    out += fmt::format("  n{} -- n{} [label=\"{}\"{}];\n", l.a, l.b, label,
                       l.kind == LinkKind::NVLink ? ", color=green" : "");
  }
  out += "}\n";
  return out;
}

}  // namespace hopwise::topology
