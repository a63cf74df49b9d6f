#include "hopwise/comm/launch.h"

#include <fmt/core.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "hopwise/comm/stores/file_store.h"
#include "hopwise/comm/stores/tcp_store.h"
#include "hopwise/comm/transports/mpi_store.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/comm/transports/ucx_transport.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::comm {

namespace {

int required_int(const char* name, int min) {
  const auto v = env::get(name);
  if (!v) return -1;
  const long long x = env::get_int(name, -1);
  if (x < min) throw InvalidArgument(fmt::format("{}={} must be an integer of at least {}", name, *v, min));
  return static_cast<int>(x);
}

bool under_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (env::get(v)) return true;
  return false;
}

// tcp://HOST:PORT from HOPWISE_STORE, else torchrun's MASTER_ADDR and MASTER_PORT.
std::string torchrun_store_address(const std::string& why_missing) {
  const auto addr = env::get("MASTER_ADDR");
  const auto port = env::get("MASTER_PORT");
  if (!addr || !port)
    throw InvalidArgument(
        fmt::format("{} but MASTER_ADDR and MASTER_PORT are not both set; set them (torchrun does) "
                    "or HOPWISE_STORE=tcp://HOST:PORT or file:///DIR",
                    why_missing));
  int p = required_int("MASTER_PORT", 1);
  if (p > 65535) throw InvalidArgument(fmt::format("MASTER_PORT={} is not a port number", *port));
  // With torchrun's static rendezvous (its multi-node form) its agent already serves torch's own store on
  // MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True): hopwise's rank 0 serves the next port.
  if (env::get_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True") ++p;
  return fmt::format("tcp://{}:{}", *addr, p);
}

}  // namespace

bool launched_as_job() {
  if (under_mpirun()) return env::get_int("OMPI_COMM_WORLD_SIZE", env::get_int("PMI_SIZE", 2)) > 1;
  return env::get_int("WORLD_SIZE", 1) > 1;
}

Launch detect_launch() {
  Launch l;
  const std::string forced = env::get_or("HOPWISE_TRANSPORT", "");
  if (!forced.empty() && forced != "mpi" && forced != "ucx")
    throw InvalidArgument(
        fmt::format("HOPWISE_TRANSPORT={} is not a transport; use mpi or ucx (or leave it unset)", forced));
  const bool mpirun = under_mpirun();
  const int rank = required_int("RANK", 0), size = required_int("WORLD_SIZE", 1);
  const bool ranked_env = rank >= 0 && size >= 1;
  if ((rank >= 0) != (size >= 1) && !mpirun)
    throw InvalidArgument("RANK and WORLD_SIZE must be set together (torchrun sets both)");
  if (ranked_env && rank >= size) throw InvalidArgument(fmt::format("RANK={} is not below WORLD_SIZE={}", rank, size));

  if (mpirun) {
    l.launcher = "mpirun";
    l.rank = static_cast<int>(env::get_int("OMPI_COMM_WORLD_RANK", 0));
    l.size = static_cast<int>(env::get_int("OMPI_COMM_WORLD_SIZE", 1));
  } else if (ranked_env) {
    l.launcher = env::get("TORCHELASTIC_RUN_ID") ? "torchrun" : "environment";
    l.rank = rank;
    l.size = size;
  } else {
    l.launcher = "single process";
  }
  // Under mpirun a job that spans hosts goes over UCX too (meeting through MPI): train_mnist's 7.45 MB of buckets a
  // step (59.6 ms on a 1 Gbit/s link) took 72-74 ms over Open MPI's TCP path and 64-65 ms over UCX's (2 hosts: 81
  // against 71-72 ms a step). Alike on every rank: each host's ranks see the same local size, and some host has fewer
  // than all.
  const long local = mpirun ? env::get_int("OMPI_COMM_WORLD_LOCAL_SIZE", 0) : 0;
  l.spans_hosts = mpirun && local > 0 && local < l.size;
  l.way = forced == "ucx" || (forced.empty() && ((!mpirun && ranked_env) || l.spans_hosts)) ? Launch::Way::kUcx
                                                                                            : Launch::Way::kMpi;
  if (l.way == Launch::Way::kMpi && forced == "mpi" && !mpirun && ranked_env && size > 1)
    throw InvalidArgument(
        fmt::format("HOPWISE_TRANSPORT=mpi, but this process was started by {} (RANK={}, "
                    "WORLD_SIZE={}), not mpirun; launch with mpirun or use HOPWISE_TRANSPORT=ucx",
                    l.launcher, rank, size));
  if (l.way == Launch::Way::kUcx) {
    if (auto s = env::get("HOPWISE_STORE")) {
      l.store = *s;
    } else if (mpirun) {
      l.store = "mpi";
    } else if (l.size == 1) {
      l.store = "inproc";
    } else {
      l.store = torchrun_store_address(
          fmt::format("{} started this rank (RANK={}, WORLD_SIZE={})", l.launcher, l.rank, l.size));
    }
    if (l.store != "mpi" && l.store != "inproc" && l.store.rfind("tcp://", 0) != 0 && l.store.rfind("file://", 0) != 0)
      throw InvalidArgument(
          fmt::format("HOPWISE_STORE={} is not a store address; use tcp://HOST:PORT or file:///DIR", l.store));
    l.job = env::get_or("TORCHELASTIC_RUN_ID", fmt::format("hopwise:{}:{}", l.store, l.size));
    if (env::get("TORCHELASTIC_RESTART_COUNT")) l.attempt = required_int("TORCHELASTIC_RESTART_COUNT", 0);
    const long local_size = env::get_int("LOCAL_WORLD_SIZE", 0);
    l.hosts_known_many = !mpirun && local_size > 0 && local_size < l.size;
  }
  l.why = fmt::format("{} (rank {} of {}): {}{}", l.launcher, l.rank, l.size,
                      l.way == Launch::Way::kMpi ? "MPI" : "UCX, meeting through " + l.store,
                      !forced.empty() ? " (HOPWISE_TRANSPORT=" + forced + ")"
                      : l.spans_hosts ? " (the job spans hosts; HOPWISE_TRANSPORT=mpi keeps MPI)"
                                      : "");
  return l;
}

namespace {

std::shared_ptr<Store> make_launch_store(const Launch& l, Store::Seconds timeout) {
  if (l.store == "mpi") return std::make_shared<MpiStore>();
  if (l.store == "inproc" || (l.store.empty() && l.size == 1)) return std::make_shared<InProcessStore>();
  if (l.store.empty())
    throw InvalidArgument(
        fmt::format("this job meets over MPI ({}): it has no store of its own; set HOPWISE_STORE "
                    "or HOPWISE_TRANSPORT=ucx for one",
                    l.why));
  if (l.store.rfind("file://", 0) == 0) {
    auto store = std::make_shared<FileStore>(l.store.substr(7), l.rank == 0, l.job, timeout, l.attempt);
    static std::vector<std::pair<std::shared_ptr<FileStore>, int>> leaving;  // left at a clean exit
    if (leaving.empty())
      std::atexit([] {
        for (auto& [s, size] : leaving) try {
            s->leave(size);
          } catch (const std::exception&) {  // a store that cannot be cleaned is reported stale by the next run
          }
      });
    leaving.emplace_back(store, l.size);
    return store;
  }
  const std::string hostport = l.store.substr(6);
  const auto colon = hostport.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hostport.size())
    throw InvalidArgument(fmt::format("store address {} lacks HOST:PORT", l.store));
  std::string host = hostport.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  for (char c : hostport.substr(colon + 1)) {
    if (!std::isdigit(static_cast<unsigned char>(c)) || port > 65535)
      throw InvalidArgument(
          fmt::format("store address {}: '{}' is not a port number", l.store, hostport.substr(colon + 1)));
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65535) throw InvalidArgument(fmt::format("store address {}: port out of range", l.store));
  TcpStoreOptions options = TcpStoreOptions::from_environment();
  const std::string resolved = l.rank == 0 && options.bind.empty() && l.hosts_known_many ? TcpStore::resolve(host) : "";
  if (resolved.rfind("127.", 0) == 0) {
    // The host's own name often resolves to a loopback address on itself (Debian's /etc/hosts), which the other
    // hosts cannot reach.
    log::warn(
        "store: {} resolves to {} here, but the job spans hosts: listening on every interface (set "
        "HOPWISE_STORE_BIND to the address the other hosts reach)",
        host, TcpStore::resolve(host));
    options.bind = "0.0.0.0";
  }
  const std::string job = l.attempt ? fmt::format("{} (attempt {})", l.job, l.attempt) : l.job;
  return std::make_shared<TcpStore>(host, port, l.rank == 0, job, timeout, options);
}

}  // namespace

// The TCP store is kept until exit (a later communicator meets through it again); the MPI one goes with the last
// transport holding it, before MPI_Finalize.
std::shared_ptr<Store> launch_store(const Launch& l, Store::Seconds timeout) {
  static std::mutex m;
  static std::weak_ptr<Store> cached;
  static std::string cached_address;
  std::lock_guard lock(m);
  if (auto s = cached.lock(); s && cached_address == l.store) return s;
  auto s = make_launch_store(l, timeout);
  cached = s;
  cached_address = l.store;
  // Kept until exit and never destroyed there (a server thread stopped during exit could wait on a client).
  static auto* kept = new std::vector<std::shared_ptr<Store>>();
  if (l.store.rfind("tcp://", 0) == 0) kept->push_back(s);
  return s;
}

std::unique_ptr<Transport> make_world_transport(const Launch& l, Store::Seconds timeout) {
  if (l.way == Launch::Way::kMpi) return std::make_unique<MpiTransport>();
  static std::atomic<int> worlds{0};  // every rank makes its world transports in the same order
  auto store = launch_store(l, timeout);
  return std::make_unique<UcxTransport>(std::move(store), l.rank, l.size, fmt::format("hopwise/world/{}", worlds++),
                                        timeout);
}

}  // namespace hopwise::comm
