// One graph for a whole job: every rank describes itself (host, CPU binding, GPU, and its host's machine), comm/
// all-gathers those views as bytes, and assemble_cluster joins the hosts through a network vertex and places each
// rank on its device. Pure: no MPI, no discovery.
#pragma once

#include <string>
#include <vector>

#include "hopwise/topology/graph.h"
#include "hopwise/topology/planner.h"

namespace hopwise::topology {

struct RankView {
  int rank = 0;
  std::string host;     // host name; ranks with the same name share a machine
  std::string cpus;     // Linux cpulist the rank is bound to ("" unknown)
  std::string gpu_bus;  // the rank's GPU ("" none)
};

// The bytes a rank contributes: a one-line JSON header (schema "hopwise-rank-view" v1), then the host's machine as
// to_json writes it. Ranks after the first on a host may pass `machine` = nullptr to send the header only.
std::string encode_view(const RankView& v, const Topology* machine);

// Host names as schedulers and people number them: digit runs compared as numbers ("n2" before "n10", "n007"
// beside "n7"), the rest byte by byte.
bool host_name_less(const std::string& a, const std::string& b);

struct Cluster {
  Topology topology;                     // all hosts; with several hosts, joined by one Network vertex "network"
  std::vector<RankPlacement> placement;  // per rank
  // Host names in host-index order: host_name_less's. Clusters number hosts along their racks, so neighbours in
  // this order mostly share a switch, and the planned ring, which visits hosts in index order, crosses each
  // switch's uplinks about once rather than wherever the ranks happened to land.
  std::vector<std::string> hosts;
  std::vector<RankView> views;  // per rank, as received
};

// views[r] is what rank r encoded. Each host's machine comes from the first of its ranks that sent one. With more
// than one host, device names get the host as prefix ("node7:GPU0"). A rank is placed on its GPU (by bus id), else
// on the NUMA node (then package) holding most of its CPUs, else on its host. Throws InvalidArgument on a view
// that does not parse, a rank number out of order, or a host whose machine no rank sent.
Cluster assemble_cluster(const std::vector<std::string>& views);
// The same from the two parts sent apart: heads[r] = encode_view(view, nullptr), machines[r] = to_json of rank r's
// machine or "" (only the first rank of a host need send one).
Cluster assemble_cluster(const std::vector<std::string>& heads, const std::vector<std::string>& machines);

}  // namespace hopwise::topology
