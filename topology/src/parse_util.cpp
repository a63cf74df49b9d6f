// The shared reader helpers of parse_util.h, with the inter-socket bandwidths that the socket mesh takes from NCCL.
#include "parse_util.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "hopwise/topology/formats.h"

namespace hopwise::topology::detail {

namespace {

// Inter-socket bandwidth in GB/s as NCCL picks it from the CPU (topo.h: BDW 6, SKL 10, SRP 22, ERP 40, AMD 16,
// ARM 6, POWER9 32); 0 when the attributes do not say.
double inter_socket_gbps(const Node& n) {
  auto get = [&](const char* k) { return n.attrs.count(k) ? n.attrs.at(k) : std::string(); };
  const std::string arch = get("arch"), vendor = get("vendor");
  const long model = std::strtol(get("modelid").c_str(), nullptr, 10);
  if (arch == "ppc64") return 32;
  if (arch == "arm64") return 6;
  if (vendor == "AuthenticAMD" || vendor == "AMD" || vendor == "HygonGenuine") return 16;
  if (vendor == "GenuineIntel") {
    if (model == 207) return 40;
    if (model == 143) return 22;
    if (model >= 85) return 10;
    return 6;
  }
  return 0;
}

// Sockets / NUMA nodes are fully meshed: k of them make k(k-1)/2 links, so k is bounded (a 100 KB file of empty
// <cpu/> elements would otherwise ask for billions). Real machines have at most a few hundred.
constexpr std::size_t kMaxMeshed = 1024;

}  // namespace

long long int_attr(const XmlElement& e, std::string_view key, long long fallback, const std::string& src) {
  const std::string* v = e.attr(key);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 0);
  if (*end != '\0')
    fail_at(src, e.line, fmt::format("expected an integer for attribute {}=\"{}\" of <{}>", key, *v, e.name));
  return x;
}

double double_attr(const XmlElement& e, std::string_view key, double fallback, const std::string& src) {
  const std::string* v = e.attr(key);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (*end != '\0' || !std::isfinite(x))
    fail_at(src, e.line, fmt::format("expected a number for attribute {}=\"{}\" of <{}>", key, *v, e.name));
  return x;
}

void check_nodes(const Topology& t, const std::string& src, int line) {
  if (static_cast<int>(t.nodes().size()) > kMaxNodes)
    fail_at(src, line, fmt::format("more than {} topology nodes; expected a single machine's topology", kMaxNodes));
}

void mesh(Topology& t, const std::vector<int>& ids, LinkKind kind, const std::string& src, int line) {
  if (ids.size() > kMaxMeshed)
    fail_at(src, line,
            fmt::format("{} sockets/NUMA nodes on one host, over the limit of {}; expected one machine's topology",
                        ids.size(), kMaxMeshed));
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t j = i + 1; j < ids.size(); ++j) {
      const double bw = std::min(inter_socket_gbps(t.node(ids[i])), inter_socket_gbps(t.node(ids[j])));
      t.add_link({ids[i], ids[j], kind, 1, 0, 0, bw, 0});
    }
}

}  // namespace hopwise::topology::detail
