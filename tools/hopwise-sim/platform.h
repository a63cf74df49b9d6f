// hopwise-sim's platforms: a fat tree from a one-line spec (written as SimGrid's cluster XML, topology FAT_TREE) or
// a SimGrid platform file as it is; the hosts the ranks go on; the ring problem the planner solves over them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hopwise/topology/planner.h"

namespace hopwise::sim_tool {

// fat-tree:hosts=H,ranks-per-host=R,link=25Gbps,oversub=O[,leaf=L][,latency=1us][,local=20GBps]: H hosts, L to a
// leaf switch (default 16, or H where fewer), each leaf with L/O uplinks, one to each of L/O spine switches (so O is
// the oversubscription of every leaf); every link `link` full duplex with `latency`; ranks on one host meet over a
// loopback of `local`.
struct FatTree {
  int hosts = 0, ranks_per_host = 1, leaf = 16, oversub = 1;
  double link_Bps = 0, latency_s = 1e-6, local_Bps = 20e9;
  std::string link_text, latency_text = "1us", local_text = "20GBps";
};

// Parses the spec (InvalidArgument naming the field and what it takes).
FatTree parse_fat_tree(const std::string& spec);
// The SimGrid platform XML of `t`.
std::string fat_tree_xml(const FatTree& t);
// Bytes per second of "25Gbps", "125MBps", "1e9" (bytes), as SimGrid reads them; InvalidArgument otherwise.
double parse_rate(const std::string& text);
// Seconds of "1us", "50ms", "0.001" (seconds).
double parse_latency(const std::string& text);

// The planner's plan (ring, trees) for ranks placed on a fat tree's hosts (`host_of[r]`: the host's index, 0..H-1,
// leaves in order), made as a job's: from the topology of its hosts (a NUMA node and a NIC each, joined by the
// network), per host, linear in the hosts.
topology::Plan plan_on_fat_tree(const FatTree& t, const std::vector<int>& host_of);

// Rank -> host index: packed (R consecutive ranks a host), cyclic (rank r on host r % H: mpirun --map-by node) or
// random (the packed slots shuffled by `seed`, as a scheduler that hands out free slots anywhere would).
enum class Placement { kPacked, kCyclic, kRandom };
std::vector<int> place(int hosts, int ranks_per_host, Placement how, std::uint64_t seed);

}  // namespace hopwise::sim_tool
