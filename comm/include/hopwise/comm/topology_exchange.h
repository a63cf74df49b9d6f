// Discovery for a whole job: each rank describes its host (discovered once per process) and itself, the views are
// all-gathered over the communicator as bytes, and topology/ assembles one cluster graph with every rank placed.
#pragma once

#include <string>

#include "hopwise/topology/cluster.h"

namespace hopwise::comm {

class Communicator;

// The machine this process runs on (hwloc, NIC speeds, NVML), discovered on first use and kept.
const topology::Topology& local_machine();

// Collective over `c`. `gpu_bus` is this rank's GPU (PCI bus id), "" for a host-memory rank.
topology::Cluster gather_cluster(Communicator& c, const std::string& gpu_bus = "");

// Writes `t` to `path`, the format chosen by the extension: .xml NCCL topology XML, .dot Graphviz, else JSON.
void dump_topology(const topology::Topology& t, const std::string& path);

}  // namespace hopwise::comm
