// The way a job is chosen from its launcher's variables (launch.h): mpirun's, torchrun's, srun's, HOPWISE_TRANSPORT and
// HOPWISE_STORE, and the errors that name a bad or missing variable; and a transport and a store scheme registered
// from outside the library, chosen by those variables like the built-in ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include <atomic>
#include <thread>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/launch.h"
#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/common/error.h"

namespace {

namespace hc = hopwise::comm;

// Sets exactly `vars` among the variables launch.h reads, for one case, and restores them after.
class Env {
 public:
  explicit Env(const std::map<std::string, std::string>& vars) {
    for (const char* k : kRead) {
      if (const char* v = std::getenv(k)) saved_[k] = v;
      ::unsetenv(k);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (const char* k : kRead) ::unsetenv(k);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  static constexpr const char* kRead[] = {"OMPI_COMM_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                                          "OMPI_COMM_WORLD_RANK",
                                          "PMI_SIZE",
                                          "PMIX_RANK",
                                          "RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_RANK",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "TORCHELASTIC_RUN_ID",
                                          "TORCHELASTIC_USE_AGENT_STORE",
                                          "TORCHELASTIC_RESTART_COUNT",
                                          "LOCAL_WORLD_SIZE",
                                          "HOPWISE_TRANSPORT",
                                          "HOPWISE_STORE",
                                          "PMI_RANK",
                                          "SLURM_STEP_ID",
                                          "SLURM_PROCID",
                                          "SLURM_NTASKS",
                                          "SLURM_STEP_NUM_TASKS",
                                          "SLURM_STEP_NUM_NODES",
                                          "SLURM_NNODES",
                                          "SLURM_STEP_NODELIST",
                                          "SLURM_JOB_ID",
                                          "SLURMD_NODENAME",
                                          "HOPWISE_SLURM_PORT"};
  std::map<std::string, std::string> saved_;
};

std::string error_of(const std::map<std::string, std::string>& vars) {
  Env env(vars);
  try {
    hc::detect_launch();
  } catch (const hopwise::InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

const std::map<std::string, std::string> kTorchrun = {{"RANK", "1"},
                                                      {"WORLD_SIZE", "4"},
                                                      {"LOCAL_RANK", "1"},
                                                      {"MASTER_ADDR", "10.0.0.7"},
                                                      {"MASTER_PORT", "29500"},
                                                      {"TORCHELASTIC_RUN_ID", "job-42"}};

std::map<std::string, std::string> torchrun_with(std::map<std::string, std::string> extra) {
  auto v = kTorchrun;
  for (auto& [k, x] : extra) v[k] = x;
  return v;
}

TEST(Launch, MpirunMeansMpi) {
  Env env({{"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_RANK", "2"}});
  const hc::Launch l = hc::detect_launch();
  EXPECT_EQ(l.transport, "mpi");
  EXPECT_EQ(l.launcher, "mpirun");
  EXPECT_EQ(l.rank, 2);
  EXPECT_EQ(l.size, 3);
  EXPECT_TRUE(hc::launched_as_job());
}

// A job across hosts goes over UCX, meeting through MPI; one host's job (or HOPWISE_TRANSPORT=mpi) stays on MPI.
TEST(Launch, MpirunAcrossHostsMeansUcxThroughMpi) {
  {
    Env env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    const hc::Launch l = hc::detect_launch();
    EXPECT_EQ(l.transport, "ucx");
    EXPECT_EQ(l.store, "mpi");
    EXPECT_TRUE(l.spans_hosts);
    EXPECT_NE(l.why.find("spans hosts"), std::string::npos) << l.why;
  }
  {
    Env env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
    EXPECT_EQ(hc::detect_launch().transport, "mpi");
  }
  {
    Env env({{"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_RANK", "1"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
             {"HOPWISE_TRANSPORT", "mpi"}});
    EXPECT_EQ(hc::detect_launch().transport, "mpi");
  }
}

TEST(Launch, TorchrunMeansUcxOverTheTcpStoreAtMaster) {
  Env env(kTorchrun);
  const hc::Launch l = hc::detect_launch();
  EXPECT_EQ(l.transport, "ucx");
  EXPECT_EQ(l.launcher, "torchrun");
  EXPECT_EQ(l.rank, 1);
  EXPECT_EQ(l.size, 4);
  EXPECT_EQ(l.store, "tcp://10.0.0.7:29500");
  EXPECT_EQ(l.job, "job-42");
}

// Each of torchrun's restarts meets afresh (a file store's directory holds the earlier attempt's keys).
TEST(Launch, TorchrunsRestartCountIsTheAttempt) {
  {
    Env env(torchrun_with({{"TORCHELASTIC_RESTART_COUNT", "2"}, {"LOCAL_WORLD_SIZE", "2"}}));
    const hc::Launch l = hc::detect_launch();
    EXPECT_EQ(l.attempt, 2);
    EXPECT_TRUE(l.hosts_known_many) << "2 ranks per host of 4";
  }
  {
    Env env(torchrun_with({{"LOCAL_WORLD_SIZE", "4"}}));
    const hc::Launch l = hc::detect_launch();
    EXPECT_EQ(l.attempt, 0);
    EXPECT_FALSE(l.hosts_known_many);
  }
  const std::string e = error_of(torchrun_with({{"TORCHELASTIC_RESTART_COUNT", "x"}}));
  EXPECT_NE(e.find("TORCHELASTIC_RESTART_COUNT"), std::string::npos) << e;
}

// torchrun's agent (its static rendezvous, and --standalone's) serves torch's own store on MASTER_PORT: hopwise's
// rank 0 serves the first free port of the next 16.
TEST(Launch, BesideTorchrunsAgentStoreTheNextFreePort) {
  {
    Env env(torchrun_with({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
    EXPECT_EQ(hc::detect_launch().store, "tcp://10.0.0.7:29501-29516");
  }
  {
    Env env(torchrun_with({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"MASTER_PORT", "65530"}}));
    EXPECT_EQ(hc::detect_launch().store, "tcp://10.0.0.7:65531-65535");
  }
  const std::string e = error_of(torchrun_with({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"MASTER_PORT", "65535"}}));
  EXPECT_NE(e.find("MASTER_PORT=65535"), std::string::npos) << e;
}

// A task of `srun -N 2 -n 4` (no --mpi): task 3 on the second node.
std::map<std::string, std::string> srun_with(std::map<std::string, std::string> more = {}) {
  std::map<std::string, std::string> v = {
      {"SLURM_STEP_ID", "0"},        {"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"},     {"SLURM_NTASKS", "4"},
      {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_NNODES", "2"}, {"SLURM_STEP_NODELIST", "h[0-1]"}, {"SLURM_JOB_ID", "17"},
      {"SLURMD_NODENAME", "h1"}};
  for (auto& [k, x] : more) v[k] = x;
  return v;
}

TEST(Launch, SrunWithoutMpiMeansUcxOverATcpStoreOnTheStepsFirstNode) {
  Env env(srun_with());
  const hc::Launch l = hc::detect_launch();
  EXPECT_EQ(l.launcher, "srun");
  EXPECT_EQ(l.transport, "ucx");
  EXPECT_FALSE(l.mpi_world);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.size, 4);
  EXPECT_TRUE(l.hosts_known_many);
  EXPECT_EQ(l.store, "tcp://h0:21088-21095");  // 20000 + (17 * 64 + 0) % 12768, and the 7 ports after it
  EXPECT_EQ(l.job, "slurm:17.0:4");
  EXPECT_TRUE(hc::launched_as_job());
}

TEST(Launch, SrunStepsOfOneJobMeetAtPortsOfTheirOwn) {
  std::string first, second;
  {
    Env env(srun_with());
    first = hc::detect_launch().store;
  }
  {
    Env env(srun_with({{"SLURM_STEP_ID", "1"}}));
    second = hc::detect_launch().store;
  }
  EXPECT_NE(first, second);
  Env env(srun_with({{"HOPWISE_SLURM_PORT", "29999"}}));
  EXPECT_EQ(hc::detect_launch().store, "tcp://h0:29999");
}

TEST(Launch, SrunWithPmixMeansMpiAsUnderMpirun) {
  {
    Env env(srun_with({{"PMIX_RANK", "3"}, {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_NNODES", "1"}}));
    const hc::Launch l = hc::detect_launch();
    EXPECT_EQ(l.launcher, "srun");
    EXPECT_TRUE(l.mpi_world);
    EXPECT_EQ(l.transport, "mpi");
    EXPECT_EQ(l.rank, 3);
  }
  Env env(srun_with({{"PMIX_RANK", "3"}}));  // two nodes: UCX, meeting through MPI
  const hc::Launch l = hc::detect_launch();
  EXPECT_EQ(l.transport, "ucx");
  EXPECT_EQ(l.store, "mpi");
}

// Under `srun torchrun` each worker has torchrun's variables and its node's SLURM_PROCID; under mpirun inside an
// allocation each rank has its daemon's: the launcher that started the process wins.
TEST(Launch, TorchrunAndMpirunInsideSlurmStayThemselves) {
  {
    auto v = srun_with(kTorchrun);
    Env env(v);
    const hc::Launch l = hc::detect_launch();
    EXPECT_EQ(l.launcher, "torchrun");
    EXPECT_EQ(l.rank, 1);
    EXPECT_EQ(l.store, "tcp://10.0.0.7:29500");
  }
  Env env(srun_with({{"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "5"}, {"PMIX_RANK", "5"}}));
  const hc::Launch l = hc::detect_launch();
  EXPECT_EQ(l.launcher, "mpirun");
  EXPECT_EQ(l.rank, 5);
  EXPECT_EQ(l.size, 8);
}

TEST(Launch, BadSlurmVariablesAreNamed) {
  EXPECT_NE(error_of(srun_with({{"SLURM_PROCID", "4"}})).find("SLURM_PROCID=4 is not below the step's 4 tasks"),
            std::string::npos);
  EXPECT_NE(error_of(srun_with({{"SLURM_STEP_NUM_TASKS", "x"}})).find("SLURM_STEP_NUM_TASKS='x' is not an integer"),
            std::string::npos);
  auto no_list = srun_with();
  no_list.erase("SLURM_STEP_NODELIST");
  EXPECT_NE(error_of(no_list).find("SLURM_STEP_NODELIST is not set"), std::string::npos);
  EXPECT_NE(error_of(srun_with({{"SLURM_PROCID", "0"}}))
                .find("rank 0 runs on h1 (SLURMD_NODENAME), not on the step's first node h0"),
            std::string::npos);
  EXPECT_NE(error_of(srun_with({{"HOPWISE_SLURM_PORT", "70000"}})).find("HOPWISE_SLURM_PORT=70000 is not a port"),
            std::string::npos);
  EXPECT_NE(error_of(srun_with({{"HOPWISE_TRANSPORT", "mpi"}})).find("launch with mpirun or srun --mpi=pmix"),
            std::string::npos);
}

TEST(Launch, SlurmHostListsGiveTheirFirstHost) {
  EXPECT_EQ(hc::slurm_first_host("h[0-3],g5"), "h0");
  EXPECT_EQ(hc::slurm_first_host("node[07-09,12]"), "node07");
  EXPECT_EQ(hc::slurm_first_host("rack[1-2]-n[4-5]"), "rack1-n4");
  EXPECT_EQ(hc::slurm_first_host("a,b"), "a");
  EXPECT_EQ(hc::slurm_first_host("gpu12"), "gpu12");
  for (const std::string bad : {"h[0-3", "h[x]", "", ",h0"}) {
    try {
      hc::slurm_first_host(bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const hopwise::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_STEP_NODELIST"), std::string::npos) << e.what();
    }
  }
}

TEST(Launch, ForcedAndAddressedByHopwiseVariables) {
  {
    Env env(torchrun_with({{"HOPWISE_STORE", "file:///shared/job"}}));
    EXPECT_EQ(hc::detect_launch().store, "file:///shared/job");
  }
  {
    Env env({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"HOPWISE_TRANSPORT", "ucx"}});
    const hc::Launch l = hc::detect_launch();
    EXPECT_EQ(l.transport, "ucx");
    EXPECT_EQ(l.store, "mpi");  // under mpirun UCX's ranks meet through MPI
  }
  {
    Env env({});
    const hc::Launch l = hc::detect_launch();
    EXPECT_EQ(l.launcher, "single process");
    EXPECT_EQ(l.size, 1);
    EXPECT_FALSE(hc::launched_as_job());
  }
}

TEST(Launch, BadVariablesAreNamed) {
  EXPECT_NE(error_of({{"HOPWISE_TRANSPORT", "carrier-pigeon"}}).find("HOPWISE_TRANSPORT=carrier-pigeon"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}}).find("RANK and WORLD_SIZE must be set together"), std::string::npos);
  EXPECT_NE(error_of(torchrun_with({{"RANK", "4"}})).find("RANK=4 is not below WORLD_SIZE=4"), std::string::npos);
  EXPECT_NE(error_of(torchrun_with({{"RANK", "x"}})).find("RANK"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR and MASTER_PORT"), std::string::npos);
  EXPECT_NE(error_of(torchrun_with({{"MASTER_PORT", "70000"}})).find("MASTER_PORT=70000"), std::string::npos);
  EXPECT_NE(error_of(torchrun_with({{"HOPWISE_STORE", "redis://x"}})).find("HOPWISE_STORE=redis://x"),
            std::string::npos);
  EXPECT_NE(error_of(torchrun_with({{"HOPWISE_TRANSPORT", "mpi"}})).find("not mpirun"), std::string::npos);
  EXPECT_EQ(error_of(kTorchrun), "no error");
}

TEST(Launch, StoreAddressesAreParsed) {
  hc::Launch l;
  l.transport = "ucx";
  l.rank = 1;  // a client: nothing is served
  l.size = 2;
  l.job = "test";
  for (const char* bad :
       {"tcp://host", "tcp://:5", "tcp://host:", "tcp://host:99999", "tcp://host:5x", "tcp://host:9-5", "tcp://host:5-",
        "tcp://host:-5", "tcp://host:1000-3000", "tcp://host:65535-65536"}) {
    l.store = bad;
    EXPECT_THROW(hc::launch_store(l, hc::Store::Seconds(0.1)), hopwise::InvalidArgument) << bad;
  }
}

// ---- the tables from outside: one row each, no library file touched ----

std::atomic<int> g_mem_stores{0};

// A store scheme: mem://NAME, one InProcessStore per name for the whole process.
void register_mem_scheme() {
  hc::register_store_scheme({"mem://", "mem://NAME", [](const hc::Launch&, const std::string&, hc::Store::Seconds) {
                               ++g_mem_stores;
                               return std::make_shared<hc::InProcessStore>();
                             }});
}

// A transport: ranks as threads of this process, one in-process world per group key.
void register_threads_transport() {
  hc::register_transport({"test-threads", "", true, [](const hc::Launch&, const hc::GroupRequest& g) {
                            static std::mutex m;
                            static std::map<std::string, std::shared_ptr<hc::InProcessWorld>> worlds;
                            std::lock_guard lock(m);
                            auto& w = worlds[g.key];
                            if (!w) w = hc::make_inprocess_world(g.size);
                            return std::unique_ptr<hc::Transport>(std::make_unique<hc::InProcessTransport>(w, g.rank));
                          }});
}

TEST(LaunchTables, ARegisteredTransportIsChosenByNameAndCarriesAGroupsCollectives) {
  register_threads_transport();
  Env env(std::map<std::string, std::string>{{"HOPWISE_TRANSPORT", "test-threads"}});
  const auto names = hc::transport_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "test-threads"), names.end());
  EXPECT_EQ(hc::detect_launch(true).transport, "test-threads");
  // Three ranks of a group, as a framework makes one: each asks comm for its transport.
  constexpr int kRanks = 3;
  std::vector<float> sums(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([r, &sums] {
      hc::GroupRequest g;
      g.rank = r;
      g.size = kRanks;
      g.store = std::make_shared<hc::InProcessStore>();
      g.key = "group/threads";
      hc::Options o;
      o.timeout_s = 30;
      hc::Communicator c(hc::make_group_transport(g), o);
      EXPECT_EQ(c.transport().name(), "inproc");
      float x = static_cast<float>(r + 1);
      c.allreduce(&x, &x, 1, hopwise::DataType::kFloat32, hopwise::ReduceOp::kSum);
      sums[static_cast<std::size_t>(r)] = x;
    });
  for (auto& t : ranks) t.join();
  for (float s : sums) EXPECT_EQ(s, 6.0f);
}

TEST(LaunchTables, ARegisteredStoreSchemeIsTakenByHopwiseStoreAndNamedInErrors) {
  register_mem_scheme();
  {
    Env env({{"HOPWISE_TRANSPORT", "ucx"}, {"HOPWISE_STORE", "mem://job"}});
    const hc::Launch l = hc::detect_launch();
    EXPECT_EQ(l.store, "mem://job");
    const int before = g_mem_stores.load();
    auto store = hc::launch_store(l, hc::Store::Seconds(5));
    EXPECT_EQ(g_mem_stores.load(), before + 1);
    store->set("k", "v");
    EXPECT_EQ(store->get("k", hc::Store::Seconds(1)), "v");
  }
  const std::string e = error_of(torchrun_with({{"HOPWISE_STORE", "redis://x"}}));
  EXPECT_NE(e.find("mem://NAME"), std::string::npos) << e;
  EXPECT_NE(e.find("tcp://HOST:PORT"), std::string::npos) << e;
}

TEST(LaunchTables, ATransportThatNeedsItsLauncherIsRefusedElsewhere) {
  hc::register_transport({"test-needs-srun", "srun", false,
                          [](const hc::Launch&, const hc::GroupRequest&) { return std::unique_ptr<hc::Transport>(); }});
  const std::string e = error_of(torchrun_with({{"HOPWISE_TRANSPORT", "test-needs-srun"}}));
  EXPECT_NE(e.find("started by torchrun"), std::string::npos) << e;
  EXPECT_NE(e.find("not srun"), std::string::npos) << e;
  EXPECT_THROW(hc::register_transport({"", "", false, {}}), hopwise::InvalidArgument);
}

}  // namespace
