// The transports and store schemes a launch chooses from (launch.h): one row each, and the factories behind them.
// A transport or store of a new kind is one row here (or register_transport / register_store_scheme from outside).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "hopwise/comm/stores/file_store.h"
#include "hopwise/comm/stores/tcp_store.h"
#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/comm/transports/mpi_store.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/comm/transports/ucx_transport.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "launch_table.h"
#include "stores/store_protocol.h"

namespace hopwise::comm {

namespace {

// ---- transports ----

// MPI: the job's MPI_COMM_WORLD, or a communicator of a group's members.
std::unique_ptr<Transport> make_mpi(const Launch& l, const GroupRequest& g) {
  if (!g.whole_job(l.size)) return MpiTransport::of_members(g.members, g.key);
  if (g.rank != l.rank || g.size != l.size)
    throw InvalidArgument(fmt::format(
        "the caller says this is rank {} of {} but {} started rank {} of {}; pass the launcher's RANK and WORLD_SIZE",
        g.rank, g.size, l.launcher, l.rank, l.size));
  return std::make_unique<MpiTransport>();
}

// UCX: meets through the group's store, or the launch's; the world's keys count up alike on every rank.
std::unique_ptr<Transport> make_ucx(const Launch& l, const GroupRequest& g) {
  static std::atomic<int> worlds{0};
  auto store = g.store ? g.store : launch_store(l, g.timeout);
  const std::string key = g.key.empty() ? fmt::format("hopwise/world/{}", worlds++) : g.key;
  return std::make_unique<UcxTransport>(std::move(store), g.rank, g.size, key, g.timeout);
}

// ---- store schemes ----

std::shared_ptr<Store> make_file_store(const Launch& l, const std::string& address, Store::Seconds timeout) {
  auto store = std::make_shared<FileStore>(address.substr(7), l.rank == 0, l.job, timeout, l.attempt);
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

std::shared_ptr<Store> make_tcp_store(const Launch& l, const std::string& address, Store::Seconds timeout) {
  const std::string hostport = address.substr(6);
  const auto colon = hostport.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hostport.size())
    throw InvalidArgument(fmt::format("store address {} lacks HOST:PORT", address));
  std::string host = hostport.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  // PORT, or FIRST-LAST: rank 0 serves on the first free port of the span and the others look over it.
  const std::string ports = hostport.substr(colon + 1);
  const auto dash = ports.find('-');
  auto number = [&](const std::string& text) {
    int port = 0;
    for (char c : text) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || port > 65535)
        throw InvalidArgument(fmt::format("store address {}: '{}' is not a port number", address, text));
      port = port * 10 + (c - '0');
    }
    if (text.empty() || port < 1 || port > 65535)
      throw InvalidArgument(fmt::format("store address {}: port '{}' out of range (1..65535)", address, text));
    return port;
  };
  const int port = number(ports.substr(0, dash));
  const int last = dash == std::string::npos ? port : number(ports.substr(dash + 1));
  if (last < port || last - port >= 1024)
    throw InvalidArgument(fmt::format("store address {}: ports {} are not a span of 1 to 1024 ports", address, ports));
  TcpStoreOptions options = TcpStoreOptions::from_environment();
  options.ports = last - port + 1;
  const std::string resolved = l.rank == 0 && options.bind.empty() && l.hosts_known_many ? TcpStore::resolve(host) : "";
  if (resolved.rfind("127.", 0) == 0) {
    // The host's own name often resolves to a loopback address on itself (Debian's /etc/hosts), which the other
    // hosts cannot reach.
    log::warn(
        "store: {} resolves to {} here, but the job spans hosts: listening on every interface (set "
        "HOPWISE_STORE_BIND to the address the other hosts reach)",
        host, resolved);
    options.bind = "0.0.0.0";
  }
  return std::make_shared<TcpStore>(host, port, l.rank == 0, store_protocol::job_attempt(l.job, l.attempt), timeout,
                                    options);
}

struct Tables {
  std::mutex mutex;
  std::vector<TransportRow> transports{
      {"mpi", "mpirun", false, make_mpi},
      {"ucx", "", true, make_ucx},
  };
  std::vector<StoreScheme> schemes{
      {"tcp://", "tcp://HOST:PORT[-LAST]", make_tcp_store},
      {"file://", "file:///DIR", make_file_store},
      {"mpi", "",
       [](const Launch&, const std::string&, Store::Seconds timeout) {
         return std::make_shared<MpiStore>(MPI_COMM_WORLD, timeout);
       }},
      {"inproc", "",
       [](const Launch&, const std::string&, Store::Seconds) { return std::make_shared<InProcessStore>(); }},
  };
};

Tables& tables() {
  static Tables t;
  return t;
}

bool matches(const StoreScheme& s, const std::string& address) {
  return s.prefix.ends_with("://") ? address.rfind(s.prefix, 0) == 0 : address == s.prefix;
}

}  // namespace

bool GroupRequest::whole_job(int job_size) const {
  if (members.empty()) return true;
  for (std::size_t i = 0; i < members.size(); ++i)
    if (members[i] != static_cast<int>(i)) return false;
  return static_cast<int>(members.size()) == job_size;
}

void register_transport(TransportRow row) {
  if (row.name.empty() || !row.make) throw InvalidArgument("register_transport: a row needs a name and a factory");
  Tables& t = tables();
  std::lock_guard lock(t.mutex);
  std::erase_if(t.transports, [&](const TransportRow& r) { return r.name == row.name; });
  t.transports.push_back(std::move(row));
}

void register_store_scheme(StoreScheme scheme) {
  if (scheme.prefix.empty() || !scheme.make)
    throw InvalidArgument("register_store_scheme: a scheme needs a prefix and a factory");
  Tables& t = tables();
  std::lock_guard lock(t.mutex);
  std::erase_if(t.schemes, [&](const StoreScheme& s) { return s.prefix == scheme.prefix; });
  t.schemes.push_back(std::move(scheme));
}

TransportRow transport_row(const std::string& name) {
  Tables& t = tables();
  std::lock_guard lock(t.mutex);
  for (const TransportRow& r : t.transports)
    if (r.name == name) return r;
  std::vector<std::string> names;
  for (const TransportRow& r : t.transports) names.push_back(r.name);
  throw InvalidArgument(fmt::format("no transport is named {}; there are {}", name, fmt::join(names, ", ")));
}

std::vector<std::string> transport_names() {
  Tables& t = tables();
  std::lock_guard lock(t.mutex);
  std::vector<std::string> names;
  for (const TransportRow& r : t.transports) names.push_back(r.name);
  return names;
}

StoreScheme store_scheme_of(const std::string& address, const std::string& what) {
  Tables& t = tables();
  std::lock_guard lock(t.mutex);
  for (const StoreScheme& s : t.schemes)
    if (matches(s, address)) return s;
  std::vector<std::string> forms;
  for (const StoreScheme& s : t.schemes)
    if (!s.form.empty()) forms.push_back(s.form);
  throw InvalidArgument(fmt::format("{} is not a store address; use {}", what, fmt::join(forms, " or ")));
}

// The store is kept until exit when its scheme serves or holds files (a later communicator meets through it again);
// the MPI one goes with the last transport holding it, before MPI_Finalize.
std::shared_ptr<Store> launch_store(const Launch& l, Store::Seconds timeout) {
  static std::mutex m;
  static std::weak_ptr<Store> cached;
  static std::string cached_address;
  std::lock_guard lock(m);
  if (auto s = cached.lock(); s && cached_address == l.store) return s;
  std::shared_ptr<Store> s;
  if (l.store.empty()) {
    if (l.size != 1)
      throw InvalidArgument(
          fmt::format("this job meets over its launcher ({}): it has no store of its own; set HOPWISE_STORE or "
                      "HOPWISE_TRANSPORT to a transport that meets through one",
                      l.why));
    s = std::make_shared<InProcessStore>();
  } else {
    s = store_scheme_of(l.store, "store address " + l.store).make(l, l.store, timeout);
  }
  cached = s;
  cached_address = l.store;
  // Kept until exit and never destroyed there (a server thread stopped during exit could wait on a client).
  static auto* kept = new std::vector<std::shared_ptr<Store>>();
  if (l.store.rfind("tcp://", 0) == 0) kept->push_back(s);
  return s;
}

std::unique_ptr<Transport> make_world_transport(const Launch& l, Store::Seconds timeout) {
  GroupRequest world;
  world.rank = l.rank;
  world.size = l.size;
  world.timeout = timeout;
  return transport_row(l.transport).make(l, world);
}

std::unique_ptr<Transport> make_group_transport(const GroupRequest& request) {
  const Launch l = detect_launch(request.store != nullptr, request.job);
  if (l.attempt == 0 || request.key.empty()) return transport_row(l.transport).make(l, request);
  // A framework's store may outlive a restart (torchrun's agent store does, holding the killed attempt's keys):
  // each attempt meets under names of its own.
  GroupRequest fresh = request;
  fresh.key += fmt::format("/attempt{}", l.attempt);
  return transport_row(l.transport).make(l, fresh);
}

}  // namespace hopwise::comm
