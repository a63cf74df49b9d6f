// How this process was launched, read from the environment, and the transport that goes with it: comm owns this,
// for the library, the tools and the frontends alike. Two tables say what there is:
//  - transports (TransportRow): a name for HOPWISE_TRANSPORT, whether it meets its peers through a store or needs a
//    launcher, and a factory for the whole job or a group of it. Built in: "mpi" (MpiTransport; needs mpirun) and
//    "ucx" (UcxTransport, meeting through a store).
//  - store schemes (StoreScheme): the addresses HOPWISE_STORE takes: tcp://HOST:PORT, file:///DIR, and mpi and
//    inproc, which launches use themselves.
// The choice: under mpirun (OMPI_COMM_WORLD_*, PMI_SIZE, PMIX_RANK) MPI within one host and UCX meeting through MPI
// once the job spans hosts; under torchrun or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
// UCX over the TCP store at MASTER; under srun (SLURM_STEP_ID, SLURM_PROCID, SLURM_STEP_NUM_TASKS), as under mpirun
// where srun hands MPI the step (--mpi=pmix), else UCX over a TCP store that rank 0 serves on the step's first node
// (SLURM_STEP_NODELIST), on a port from SLURM_JOB_ID and SLURM_STEP_ID (HOPWISE_SLURM_PORT overrides it);
// HOPWISE_TRANSPORT=<row> forces one. Every check and its message comes from the
// rows, so a registered transport or store scheme is accepted and named like the built-in ones.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hopwise/comm/store.h"
#include "hopwise/comm/transport.h"

namespace hopwise::comm {

// This process's rank and the job's size as a framework was told them (torch's init_process_group(rank=,
// world_size=)): outside mpirun they win over RANK/WORLD_SIZE, as gloo's do. -1: not given.
struct JobRank {
  int rank = -1, size = -1;
  bool given() const { return rank >= 0 && size >= 1; }
};

struct Launch {
  std::string transport = "mpi";  // the TransportRow's name
  int rank = 0, size = 1;
  std::string launcher;    // "mpirun", "torchrun", "srun", "environment" (RANK/WORLD_SIZE), "single process"
  bool mpi_world = false;  // MPI_Init joins the job's ranks into one world: mpirun, or srun --mpi=pmix
  std::string store;       // where the ranks meet when the transport needs a store: "mpi", "tcp://host:port", ...
  std::string job;         // the job's name, which a TCP or file store checks
  int attempt = 0;         // torchrun's restart count (TORCHELASTIC_RESTART_COUNT): each attempt meets afresh
  bool hosts_known_many = false;  // torchrun says the job spans hosts (LOCAL_WORLD_SIZE below WORLD_SIZE)
  std::string why;                // one line for the log: what was read and what it chose
  bool spans_hosts = false;       // mpirun's local size is below the job's (known before any rank talks)
};

// What a transport is made for: the whole job, or a group of it (a framework's subgroup).
struct GroupRequest {
  int rank = 0, size = 1;        // this process in the group
  std::vector<int> members;      // the group's ranks in the job, in group-rank order; empty: the whole job
  std::shared_ptr<Store> store;  // where the members meet (a framework's own store); null: the launch's store
  std::string key;               // the group's name, alike on its members; empty: the next world's
  JobRank job;                   // the framework's world rank and size, where it knows them (detect_launch)
  Store::Seconds timeout{300};
  bool whole_job(int job_size) const;  // no members, or every rank of the job in order
};

struct TransportRow {
  std::string name;      // HOPWISE_TRANSPORT's value, Transport::name()
  std::string launcher;  // the launcher it needs ("mpirun": MPI's runtime, which srun --mpi=pmix gives too); empty: any
  bool needs_store = false;  // meets its peers through a store (Launch::store), not through its launcher
  std::function<std::unique_ptr<Transport>(const Launch&, const GroupRequest&)> make;
};

struct StoreScheme {
  std::string prefix;  // what an address starts with: "tcp://", "file://"; or the whole address: "mpi", "inproc"
  std::string form;    // how to write one, for messages: "tcp://HOST:PORT"
  std::function<std::shared_ptr<Store>(const Launch&, const std::string& address, Store::Seconds timeout)> make;
};

// The tables. Registering a name that is there replaces its row; rows registered before a launch is detected are
// seen by it (HOPWISE_TRANSPORT, HOPWISE_STORE, the errors that list what there is).
void register_transport(TransportRow row);
void register_store_scheme(StoreScheme scheme);
// The row of `name`; InvalidArgument listing the known names where there is none.
TransportRow transport_row(const std::string& name);
std::vector<std::string> transport_names();

// The first host of a Slurm host list ("node[07-09],gpu1" -> node07); InvalidArgument naming SLURM_STEP_NODELIST
// where it is malformed.
std::string slurm_first_host(const std::string& nodelist);

// Throws InvalidArgument naming the variable that is missing or malformed. `own_store`: the caller brings the store
// its ranks meet through (a framework's): launched outside mpirun, the job then runs over a store-meeting transport
// without needing a store address of its own.
Launch detect_launch(bool own_store = false, JobRank given = {});

// The store named by `launch.store` (for tcp, rank 0 serves it, on the store host's address unless
// HOPWISE_STORE_BIND says otherwise, checking HOPWISE_STORE_TOKEN), made on first use and shared by every world
// transport of this process: a second server on the same port would fail. TCP and file stores last until exit; at
// a clean exit the last rank to leave a file store removes its keys.
std::shared_ptr<Store> launch_store(const Launch& launch, Store::Seconds timeout);

// The transport of the whole job, by its row.
std::unique_ptr<Transport> make_world_transport(const Launch& launch, Store::Seconds timeout);
// The transport of a group, by the row the launch chooses (detect_launch(request.store != nullptr)). Collective
// over the group's members only. Under a restarted launch (torchrun's attempt N > 0) the key gains "/attemptN".
std::unique_ptr<Transport> make_group_transport(const GroupRequest& request);

// Whether this process is one of several ranks of a job (started by mpirun, torchrun or the like).
bool launched_as_job();

}  // namespace hopwise::comm
