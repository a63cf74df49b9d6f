// How this process was launched, read from the environment, and the transport that goes with it: under mpirun
// (OMPI_COMM_WORLD_*) MPI within one host and UCX (meeting through MPI) once the job spans hosts; under torchrun or
// any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT the TCP store and UCX; HOPWISE_TRANSPORT=mpi|ucx
// forces one. The store's address is HOPWISE_STORE (tcp://HOST:PORT or file:///DIR) where set.
#pragma once

#include <memory>
#include <string>

#include "hopwise/comm/store.h"
#include "hopwise/comm/transport.h"

namespace hopwise::comm {

struct Launch {
  enum class Way { kMpi, kUcx };
  Way way = Way::kMpi;
  int rank = 0, size = 1;
  std::string launcher;           // "mpirun", "torchrun", "environment" (RANK/WORLD_SIZE), "single process"
  std::string store;              // where the ranks meet for UCX: "mpi", "tcp://host:port", "file:///dir"
  std::string job;                // the job's name, which a TCP or file store checks
  int attempt = 0;                // torchrun's restart count (TORCHELASTIC_RESTART_COUNT): each attempt meets afresh
  bool hosts_known_many = false;  // torchrun says the job spans hosts (LOCAL_WORLD_SIZE below WORLD_SIZE)
  std::string why;                // one line for the log: what was read and what it chose
  bool spans_hosts = false;       // mpirun's local size is below the job's (known before any rank talks)
};

// Throws InvalidArgument naming the variable that is missing or malformed.
Launch detect_launch();

// The store named by `launch.store` (for tcp, rank 0 serves it, on the store host's address unless
// HOPWISE_STORE_BIND says otherwise, checking HOPWISE_STORE_TOKEN), made on first use and shared by every world
// transport of this process: a second server on the same port would fail. TCP and file stores last until exit; at
// a clean exit the last rank to leave a file store removes its keys.
std::shared_ptr<Store> launch_store(const Launch& launch, Store::Seconds timeout);

// The transport of the whole job: MpiTransport(MPI_COMM_WORLD), or UcxTransport meeting through the launch store.
std::unique_ptr<Transport> make_world_transport(const Launch& launch, Store::Seconds timeout);

// Whether this process is one of several ranks of a job (started by mpirun, torchrun or the like).
bool launched_as_job();

}  // namespace hopwise::comm
