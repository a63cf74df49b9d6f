// Format detection from the content and the entry points that dispatch on it (parse_topology, load_topology),
// with the size and NUL-byte checks every input goes through; save_text for the writers' output.
#include "hopwise/topology/formats.h"

#include <fmt/core.h>

#include <cctype>
#include <fstream>
#include <sstream>
#include <string>

#include "hopwise/common/error.h"

namespace hopwise::topology {

std::string_view to_string(TopologyFormat f) {
  switch (f) {
    case TopologyFormat::HwlocXml: return "hwloc-xml";
    case TopologyFormat::NcclXml: return "nccl-xml";
    case TopologyFormat::NcclGraphXml: return "nccl-graph-xml";
    case TopologyFormat::NvidiaSmi: return "nvidia-smi";
    case TopologyFormat::Json: return "json";
    default: return "unknown";
  }
}

TopologyFormat detect_format(std::string_view text) {
  std::size_t i = 0;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") i = 3;
  // Skip whitespace, XML declaration, comments and DOCTYPE to find the root element name.
  for (;;) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (text.substr(i, 4) == "<!--") {
      const auto e = text.find("-->", i);
      if (e == std::string_view::npos) return TopologyFormat::Unknown;
      i = e + 3;
    } else if (text.substr(i, 2) == "<?" || text.substr(i, 9) == "<!DOCTYPE") {
      auto e = text.find('>', i);
      const auto bracket = text.find('[', i);
      if (text[i + 1] == '!' && bracket < e) {  // internal subset: skipped here, rejected by the XML reader
        e = text.find("]>", bracket);
        if (e != std::string_view::npos) ++e;
      }
      if (e == std::string_view::npos) return TopologyFormat::Unknown;
      i = e + 1;
    } else {
      break;
    }
  }
  if (i >= text.size()) return TopologyFormat::Unknown;
  if (text[i] == '{') return TopologyFormat::Json;
  if (text[i] == '<') {
    std::size_t e = i + 1;
    while (e < text.size() && (std::isalnum(static_cast<unsigned char>(text[e])) || text[e] == '_')) ++e;
    const std::string_view name = text.substr(i + 1, e - i - 1);
    if (name == "topology") return TopologyFormat::HwlocXml;
    if (name == "system") return TopologyFormat::NcclXml;
    if (name == "graphs") return TopologyFormat::NcclGraphXml;
    return TopologyFormat::Unknown;
  }
  // nvidia-smi: a line whose first token is GPU0 within the first lines.
  std::stringstream ss{std::string(text.substr(i, 64 * 1024))};
  int n = 0;
  for (std::string l; std::getline(ss, l) && n < 10; ++n) {
    std::stringstream ls(l);
    std::string first;
    ls >> first;
    if (first == "GPU0") return TopologyFormat::NvidiaSmi;
  }
  return TopologyFormat::Unknown;
}

Topology parse_topology(std::string_view text, const std::string& source) {
  if (text.size() > kMaxFileBytes)
    throw InvalidArgument(fmt::format("{}:1: input is {} bytes, over the limit of {} bytes for a topology file", source,
                                      text.size(), kMaxFileBytes));
  if (text.find('\0') != std::string_view::npos)
    throw InvalidArgument(fmt::format("{}:1: input contains NUL bytes; expected a text topology file", source));
  switch (detect_format(text)) {
    case TopologyFormat::HwlocXml: return parse_hwloc_xml(text, source);
    case TopologyFormat::NcclXml:
    case TopologyFormat::NcclGraphXml: return parse_nccl_xml(text, source);
    case TopologyFormat::NvidiaSmi: return parse_nvidia_smi(text, source);
    case TopologyFormat::Json: return parse_json(text, source);
    default: break;
  }
  // Say where the first unexpected content sits.
  int line = 1;
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) line += text[i++] == '\n';
  throw InvalidArgument(
      fmt::format("{}:{}: unrecognised topology format; expected hwloc XML (<topology>), NCCL XML "
                  "(<system version=\"1\">), an `nvidia-smi topo -m` matrix or hopwise JSON",
                  source, line));
}

Topology load_topology(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InvalidArgument(fmt::format("{}: can not open the topology file; check the path", path));
  f.seekg(0, std::ios::end);
  const auto size = f.tellg();
  if (size < 0) throw InvalidArgument(fmt::format("{}: can not read the topology file", path));
  if (static_cast<std::size_t>(size) > kMaxFileBytes)
    throw InvalidArgument(fmt::format("{}:1: file is {} bytes, over the limit of {} bytes for a topology file", path,
                                      static_cast<long long>(size), kMaxFileBytes));
  f.seekg(0);
  std::string text(static_cast<std::size_t>(size), '\0');
  f.read(text.data(), size);
  if (!f) throw InvalidArgument(fmt::format("{}: read error", path));
  return parse_topology(text, path);
}

void save_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw InvalidArgument(fmt::format("{}: can not write the file; check the directory exists", path));
}

}  // namespace hopwise::topology
