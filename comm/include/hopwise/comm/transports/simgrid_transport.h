// The SimGrid transport: simulated ranks on a SimGrid platform (built where SimGrid is found, into the library
// hopwise_comm_simgrid, not installed; the simulator in sim/ builds on it). Each
// rank is an S4U actor on a host of the platform; its transport (the point-to-point contract of transport.h) sends over
// SimGrid mailboxes with each message's true size, and a wait is a simulated wait: the algorithms of
// comm/src/algorithms run on it unchanged and take the time the platform's links and their sharing give them.
//
// SimGrid runs every actor on one OS thread, switching between them only inside its own calls. So the code an actor
// runs must never block the thread on anything another actor would release (an OS mutex held across a SimGrid call,
// a condition variable, a sleep, a spin on a flag another rank sets, a thread of its own): the transport never does,
// and the algorithm rows run on it are those whose run is a sequence of sends, receives and waits (sim_algorithms()
// lists them; the shared-slot rows have no slots here). hier's pipeline runs its phases side by side as parts of
// the call (algorithms/side_by_side.h): here each part is an actor of the rank's host and the parts wait on
// SimGrid's condition variables (comm/src/transports/simgrid/actor_side_by_side.h). Nothing here takes an OS lock.
//
// No SimGrid type appears in this header: programs that use it link hopwise_sim and need no SimGrid header.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/transport.h"

namespace hopwise::comm::sim {

// Sets one of SimGrid's options ("network/latency-factor:1"), before load_platform; InvalidArgument naming it when
// SimGrid refuses it.
void configure(const std::string& name_colon_value);
// Loads a SimGrid platform file (XML) into this process's engine. SimGrid keeps one engine per process, so a process
// loads one platform; a second call with the same file does nothing, with another throws InvalidArgument.
void load_platform(const std::string& xml_path);
// The platform's hosts, sorted by name with digit runs as numbers (n2 before n10): a cluster's in its radical's order.
std::vector<std::string> host_names();
// The simulated clock, seconds.
double now();
// Inside a rank: lets `seconds` of simulated time pass (a rank that computes, or stalls).
void sleep_for(double seconds);

struct RunOptions {
  // Whether messages carry their bytes (a receive gets what was sent). Without, only sizes travel and the
  // algorithms' element-wise work (reductions, scaling, copies) is skipped, its time still charged: buffers hold
  // nothing, so every rank may use the same ones (thousands of ranks in one process).
  bool real_payloads = true;
  // The element-wise work's simulated time: bytes / rate (reduce: its output's bytes; scale and copy: the bytes
  // they write), the rank's actor held that long, as a core of its own would be. 0: no time.
  double reduce_bytes_per_s = 0, copy_bytes_per_s = 0;
  // Whether a message's bytes start to flow when it is sent, before its receive is posted (each rank is the
  // permanent receiver of its mailboxes), as over TCP and MPI's eager path; else only once both sides are there.
  bool eager = true;
  // A wait's limit in simulated seconds (Transport::timeout()).
  double timeout_s = 600;
  // The most bytes the messages in flight may hold (real payloads are copied at the send): past it a send throws
  // InvalidArgument rather than the process running out of memory.
  std::size_t max_held_bytes = std::size_t{4} << 30;
};

// Runs body(rank, transport) on one actor per rank, rank r on the host named hosts[r] (several ranks may share a
// host), until every rank has returned; the simulated seconds from the start to the last return. Rethrows the
// exception that came first in simulated time (the cause; others' timeouts follow from it) once every rank has
// finished. Ranks on one host are "on one host" to the transport
// (host_id, local_rank), and their messages cross the host's loopback, not the network.
double run_ranks(const std::vector<std::string>& hosts, const std::function<void(int, Transport&)>& body,
                 const RunOptions& options = {});

// The algorithm rows that run on simulated ranks (see above).
std::vector<Algorithm> sim_algorithms();

}  // namespace hopwise::comm::sim
