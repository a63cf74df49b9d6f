#include <fmt/core.h>

#include "hopwise/comm/algorithm.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

std::string_view to_string(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kHalvingDoubling: return "hd";
    case Algorithm::kTree: return "tree";
    case Algorithm::kNative: return "native";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kSharedMemory: return "shm";
    case Algorithm::kHierarchical: return "hier";
  }
  return "unknown";
}

std::string_view to_string(Collective c) {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllgather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kBarrier: return "barrier";
    case Collective::kSend: return "send";
    case Collective::kRecv: return "recv";
  }
  return "unknown";
}

Algorithm parse_algorithm(std::string_view n) {
  if (n == "auto") return Algorithm::kAuto;
  if (n == "ring") return Algorithm::kRing;
  if (n == "hd" || n == "halving-doubling" || n == "rabenseifner") return Algorithm::kHalvingDoubling;
  if (n == "tree" || n == "double-tree") return Algorithm::kTree;
  if (n == "native" || n == "mpi") return Algorithm::kNative;
  if (n == "direct" || n == "oneshot") return Algorithm::kDirect;
  if (n == "shm" || n == "shared-memory") return Algorithm::kSharedMemory;
  if (n == "hier" || n == "hierarchical") return Algorithm::kHierarchical;
  throw InvalidArgument(
      fmt::format("unknown algorithm '{}'; use one of auto, ring, hd, tree, native, direct, shm, hier", n));
}

bool implements(Algorithm a, Collective c) {
  switch (a) {
    case Algorithm::kAuto: return true;
    case Algorithm::kNative: return c != Collective::kSend && c != Collective::kRecv;
    case Algorithm::kRing:
      return c == Collective::kAllreduce || c == Collective::kReduceScatter || c == Collective::kAllgather ||
             c == Collective::kBarrier;
    case Algorithm::kHalvingDoubling:
    case Algorithm::kDirect:
    case Algorithm::kSharedMemory:
    case Algorithm::kHierarchical: return c == Collective::kAllreduce;
    case Algorithm::kTree:
      return c == Collective::kAllreduce || c == Collective::kReduce || c == Collective::kBroadcast;
  }
  return false;
}

}  // namespace hopwise::comm
