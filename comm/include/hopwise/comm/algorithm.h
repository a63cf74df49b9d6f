// Names for collectives and algorithms, shared by the communicator, the cost model and the benchmark.
#pragma once

#include <string_view>

namespace hopwise::comm {

enum class Algorithm { kAuto, kRing, kHalvingDoubling, kTree, kNative, kDirect, kSharedMemory, kHierarchical };
enum class Collective { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kReduce, kBarrier, kSend, kRecv };

std::string_view to_string(Algorithm a);  // "auto", "ring", "hd", "tree", "native", "direct", "shm", "hier"
std::string_view to_string(Collective c);
// Throws InvalidArgument listing the choices.
Algorithm parse_algorithm(std::string_view name);

// Whether `a` implements `c` (e.g. hd implements allreduce only, tree allreduce/reduce/broadcast).
bool implements(Algorithm a, Collective c);

}  // namespace hopwise::comm
