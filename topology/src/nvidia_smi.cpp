// The `nvidia-smi topo -m` matrix reader: the GPUs and NICs of one host under their NUMA nodes, NV# cells as NVLink
// edges and every cell as the declared path class of its pair.
#include "hopwise/topology/formats.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "parse_util.h"
#include "xml.h"

namespace hopwise::topology {

using detail::fail_at;
using detail::mesh;
using detail::starts_with;

Topology parse_nvidia_smi(std::string_view text, const std::string& src) {
  std::vector<std::string> lines;
  {
    std::string cur;
    for (char c : text) {
      if (c == '\n') {
        lines.push_back(cur);
        cur.clear();
      } else if (c != '\r') {
        cur += c;
      }
    }
    if (!cur.empty()) lines.push_back(cur);
  }
  auto tokens = [](const std::string& l) {
    std::vector<std::string> out;
    std::stringstream ss(l);
    for (std::string w; ss >> w;) out.push_back(w);
    return out;
  };
  // Header: the first line whose first token is GPU0.
  std::size_t hi = 0;
  std::vector<std::string> cols;
  bool has_cpu = false, has_numa = false, has_gpu_numa = false;
  for (; hi < lines.size(); ++hi) {
    auto tk = tokens(lines[hi]);
    if (!tk.empty() && tk[0] == "GPU0") {
      for (std::size_t k = 0; k < tk.size(); ++k) {
        if (tk[k] == "CPU" && k + 1 < tk.size() && tk[k + 1] == "Affinity")
          has_cpu = true, ++k;
        else if (tk[k] == "NUMA" && k + 1 < tk.size() && tk[k + 1] == "Affinity")
          has_numa = true, ++k;
        else if (tk[k] == "GPU" && k + 2 < tk.size() && tk[k + 1] == "NUMA")
          has_gpu_numa = true, k += 2;
        else if (!has_cpu && !has_numa)
          cols.push_back(tk[k]);
        else
          fail_at(src, static_cast<int>(hi) + 1, fmt::format("unexpected header column '{}'", tk[k]));
      }
      break;
    }
    const std::string trimmed = tk.empty() ? "" : tk[0];
    if (!tk.empty() && trimmed[0] != '#' && lines[hi].find("nvidia-smi") == std::string::npos)
      fail_at(src, static_cast<int>(hi) + 1,
              "expected the `nvidia-smi topo -m` header row starting with GPU0 (after optional comment lines)");
  }
  if (hi == lines.size()) fail_at(src, static_cast<int>(lines.size()), "expected a header row starting with GPU0");
  const std::size_t n = cols.size();
  if (n > 4096) fail_at(src, static_cast<int>(hi) + 1, "more than 4096 devices in the matrix");
  Topology t;
  t.source_format = "nvidia-smi";
  t.source_name = src;
  Node h;
  h.kind = NodeKind::Host;
  h.name = "host0";
  const int host = t.add_node(std::move(h));
  std::vector<int> ids(n, -1);
  std::vector<std::vector<std::string>> cell(n);
  std::vector<int> numa_of(n, -1);
  std::vector<std::string> aff(n);
  std::size_t li = hi + 1;
  std::size_t rows = 0;
  for (; li < lines.size() && rows < n; ++li) {
    auto tk = tokens(lines[li]);
    if (tk.empty()) break;
    const int line = static_cast<int>(li) + 1;
    const auto it = std::find(cols.begin(), cols.end(), tk[0]);
    if (it == cols.end())
      fail_at(src, line,
              fmt::format("expected a matrix row starting with one of the header devices, found '{}'", tk[0]));
    const std::size_t r = static_cast<std::size_t>(it - cols.begin());
    if (!cell[r].empty()) fail_at(src, line, fmt::format("row '{}' appears twice", tk[0]));
    const bool gpu_row = starts_with(tk[0], "GPU");
    const std::size_t extra = gpu_row ? (has_cpu ? 1u : 0u) + (has_numa ? 1u : 0u) + (has_gpu_numa ? 1u : 0u) : 0u;
    if (tk.size() != 1 + n + extra && !(gpu_row && tk.size() == 1 + n))
      fail_at(src, line,
              fmt::format("row '{}' has {} fields; expected the device name, {} matrix cells and {} affinity columns",
                          tk[0], tk.size(), n, extra));
    cell[r].assign(tk.begin() + 1, tk.begin() + 1 + static_cast<long>(n));
    std::size_t k = 1 + n;
    if (gpu_row && tk.size() > k) {
      if (has_cpu) aff[r] = tk[k++];
      if (has_numa) {
        char* end = nullptr;
        const long v = std::strtol(tk[k].c_str(), &end, 10);
        if (*end == '\0') numa_of[r] = static_cast<int>(v);
        ++k;
      }
    }
    for (std::size_t c = 0; c < n; ++c) {
      const std::string& v = cell[r][c];
      const bool ok = v == "X" || v == "PIX" || v == "PXB" || v == "PHB" || v == "NODE" || v == "SYS" ||
                      (starts_with(v, "NV") && v.size() > 2 && v.size() <= 6 &&  // NV1..NV9999: atoi must not overflow
                       std::all_of(v.begin() + 2, v.end(), ::isdigit));
      if (!ok)
        fail_at(src, line,
                fmt::format("unknown cell '{}' in row '{}'; expected X, NV#, PIX, PXB, PHB, NODE or SYS", v, tk[0]));
      if ((c == r) != (v == "X"))
        fail_at(src, line, fmt::format("row '{}' column '{}': expected X exactly on the diagonal", tk[0], cols[c]));
    }
    ++rows;
  }
  if (rows < n) fail_at(src, static_cast<int>(li) + 1, fmt::format("expected {} matrix rows, found {}", n, rows));
  // NIC legend: "  NIC0: mlx5_0".
  std::map<std::string, std::string> legend;
  for (; li < lines.size(); ++li) {
    auto tk = tokens(lines[li]);
    if (tk.size() == 2 && tk[0].size() > 1 && tk[0].back() == ':' && starts_with(tk[0], "NIC"))
      legend[tk[0].substr(0, tk[0].size() - 1)] = tk[1];
  }
  // NUMA nodes.
  std::map<int, int> numa_node;
  for (int v : numa_of)
    if (v >= 0 && !numa_node.count(v)) {
      Node nn;
      nn.kind = NodeKind::Numa;
      nn.index = nn.numa = v;
      nn.name = fmt::format("NUMA{}", v);
      numa_node[v] = t.add_node(std::move(nn));
      t.add_link({host, numa_node[v], LinkKind::Internal, 1, 0, 0, 0, 0});
    }
  int gpus = 0, nics = 0, network = -1;
  for (std::size_t r = 0; r < n; ++r) {
    Node d;
    const bool gpu = starts_with(cols[r], "GPU");
    d.kind = gpu ? NodeKind::Gpu : NodeKind::Nic;
    d.index = gpu ? gpus++ : nics++;
    d.name = legend.count(cols[r]) ? legend[cols[r]] : cols[r];
    if (d.name != cols[r]) d.attrs["column"] = cols[r];
    d.cpu_affinity = aff[r] == "N/A" ? "" : aff[r];
    d.numa = numa_of[r];
    ids[r] = t.add_node(std::move(d));
  }
  // NICs take the NUMA node of the closest GPU.
  for (std::size_t r = 0; r < n; ++r) {
    if (t.node(ids[r]).kind != NodeKind::Nic) continue;
    int best = static_cast<int>(PathClass::SYS), numa = -1;
    for (std::size_t g = 0; g < n; ++g) {
      if (t.node(ids[g]).kind != NodeKind::Gpu || cell[r][g] == "X") continue;
      const int c = starts_with(cell[r][g], "NV") ? static_cast<int>(PathClass::NVL)
                                                  : static_cast<int>(path_class_from_string(cell[r][g]));
      if (c < best) best = c, numa = numa_of[g];
    }
    t.node(ids[r]).numa = numa;
  }
  for (std::size_t r = 0; r < n; ++r) {
    const Node& d = t.node(ids[r]);
    const int parent = d.numa >= 0 && numa_node.count(d.numa) ? numa_node[d.numa] : host;
    t.add_link({parent, ids[r], LinkKind::PCIe, 1, 0, 0, 0, 0});
    if (d.kind == NodeKind::Nic) {
      if (network < 0) {
        Node nw;
        nw.kind = NodeKind::Network;
        nw.name = "network0";
        network = t.add_node(std::move(nw));
      }
      t.add_link({ids[r], network, LinkKind::Network, 1, 0, 0, 0, 0});
    }
  }
  std::vector<int> numas;
  for (auto& [k, v] : numa_node) numas.push_back(v);
  if (numas.size() >= 2) mesh(t, numas, LinkKind::InterSocket, src, static_cast<int>(hi) + 1);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < n; ++c) {
      if (r == c) continue;
      const std::string& v = cell[r][c];
      if (v != cell[c][r])
        fail_at(src, static_cast<int>(hi + 2 + r),
                fmt::format("matrix is not symmetric: {}->{} is {} but {}->{} is {}", cols[r], cols[c], v, cols[c],
                            cols[r], cell[c][r]));
      if (starts_with(v, "NV")) {
        t.declare_path_class(ids[r], ids[c], PathClass::NVL);
        if (r < c) {
          const int count = std::atoi(v.c_str() + 2);
          t.add_link({ids[r], ids[c], LinkKind::NVLink, count, 0, 0, nvlink_bandwidth_gbps(count), 0});
        }
      } else {
        t.declare_path_class(ids[r], ids[c], path_class_from_string(v));
      }
    }
  return t;
}

}  // namespace hopwise::topology
