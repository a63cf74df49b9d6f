// The algorithm table: every collective algorithm is one row (its name, the collectives it implements, what it
// needs from the transport, its cost estimate and its run function). The communicator's dispatch, `auto`'s
// candidates, HOPWISE_ALGO's parsing and the tests' lists all read the table, so adding an algorithm is one file
// plus one row (built-ins: comm/src/algorithms/registry.cpp), and code outside the library can register one.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/common/dtype.h"

namespace hopwise::comm {

// The built-in algorithms keep fixed ids, each tied to its row in registry.cpp (kBuiltIns, checked at compile time);
// register_algorithm hands out the ids after kFirstRegistered.
enum class Algorithm : int {
  kAuto = 0,
  kRing,
  kHalvingDoubling,
  kTree,
  kNative,
  kOneShot,  // one-shot: every rank reads every input (shared slots, else eager messages)
  kTwoShot,  // two-shot through the shared slots: reduce-scatter, then allgather
  kHierarchical,
  kFirstRegistered
};
enum class Collective { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kReduce, kBarrier, kSend, kRecv };

class Transport;
struct CostParams;
namespace detail {
struct PlanState;
}
class Workspace;

// One collective call as an algorithm sees it. `op` is never kAvg: avg arrives as kSum with scale = 1/p, which
// the algorithm applies to its result. `count` is per rank as the public call counts it (reduce_scatter: the
// block each rank receives; allgather: the block each rank sends).
struct CollectiveCall {
  Collective kind = Collective::kAllreduce;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  DataType dt = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double scale = 1.0;
  int root = 0;
};

// What a run gets from the communicator: its transport, its chunk size and ring order, and (for the built-in
// rows) the communicator's scratch space and plan state, opaque outside the library.
struct AlgorithmContext {
  Transport& transport;
  std::size_t chunk_bytes;
  const std::vector<int>& ring;
  Workspace* workspace = nullptr;
  detail::PlanState* plan = nullptr;
  bool one_channel = false;  // the ring allreduce runs one ring even where the plan has several channels
  int first_tag = 0;         // the row's own message tags: first_tag .. first_tag + AlgorithmInfo::tags - 1
  // The ring's sends in flight at most (0: no limit). Across hosts a whole block queued at once made Open MPI's
  // TCP path carry one direction at a time; within a host the limit only costs (HOPWISE_RING_WINDOW).
  std::size_t send_window = 0;
};

// What a cost estimate is asked: seconds for `collective` on `bytes` (per rank, as the benchmark reports it).
struct CostQuery {
  Collective collective = Collective::kAllreduce;
  std::size_t bytes = 0;
  int ranks = 1;
  int hosts = 1;       // hosts of the plan (1 without a plan)
  int tree_depth = 1;  // of the planned tree
  const CostParams* params = nullptr;
};

struct AlgorithmInfo {
  std::string name;                     // as HOPWISE_ALGO, `-a` and every table spell it
  std::vector<std::string> aliases;     // other spellings parse_algorithm accepts
  std::vector<Collective> collectives;  // the collectives it implements
  bool needs_native = false;            // runs the transport library's own collectives
  bool candidate = true;                // `auto` considers it (where it implements the collective)
  // What the tuner tries besides the row at the communicator's chunk: pipelined rows also at 4x the chunk where a
  // call holds many chunks; a row that runs the plan's ring channels side by side also on one ring.
  bool pipelined = false;
  bool channels = false;
  // Between any two ranks its messages are sent, and their receives posted, in one order (one thread, one tree):
  // a small call's stamp may then ride in its first message to each peer (comm/src/call_stamps.h).
  bool one_order = false;
  // Message tags its run uses, handed out by the table (AlgorithmContext::first_tag), apart from every other row's
  // and from the user's send/recv. The built-in rows keep the fixed tags of comm/src/algorithms/algorithms.h.
  int tags = 0;
  int first_tag = 0;    // set by the table
  std::string summary;  // one line: what it does
  // Seconds the call would take (INFINITY: not possible here, e.g. no shared slots).
  std::function<double(const CostQuery&)> estimate;
  // Runs the call on every rank; the communicator has already handled 1 rank and empty buffers.
  std::function<void(AlgorithmContext&, const CollectiveCall&)> run;
  Algorithm id = Algorithm::kAuto;  // set by the table
};

// Adds a row (callable from outside the library, e.g. a test); returns its id. Register before the communicators
// that should see it make their first call. Throws InvalidArgument for a name or alias already taken, or a row
// without a run function or collectives.
Algorithm register_algorithm(AlgorithmInfo info);
// The row of `a` (throws InvalidArgument for an id that is not in the table, or for kAuto).
const AlgorithmInfo& algorithm_info(Algorithm a);
// Every row's id, in table order (built-ins first), kAuto excluded.
std::vector<Algorithm> all_algorithms();

std::string_view to_string(Algorithm a);  // the row's name; "auto" for kAuto
std::string_view to_string(Collective c);
// A name or alias of any row, or "auto"; throws InvalidArgument listing the choices.
Algorithm parse_algorithm(std::string_view name);

// Message tags the engine keeps for point-to-point exchanges of the layers above it (the training layer's gossip
// averager), apart from every algorithm row's and from the user's send/recv, and alike on every rank.
struct TagRange {
  int first = 0;
  int count = 0;
};
// The range kept for `user` ("gossip"); InvalidArgument naming the known users for any other.
TagRange reserved_tags(std::string_view user);

// Whether `a` implements `c` (kAuto implements everything).
bool implements(Algorithm a, Collective c);

}  // namespace hopwise::comm
