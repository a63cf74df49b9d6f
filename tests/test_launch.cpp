// The way a job is chosen from its launcher's variables (launch.h): mpirun's, torchrun's, HOPWISE_TRANSPORT and
// HOPWISE_STORE, and the errors that name a bad or missing variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "hopwise/comm/launch.h"
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
                                          "HOPWISE_STORE"};
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

// torchrun's static rendezvous (its multi-node form) serves torch's own store on MASTER_PORT.
TEST(Launch, BesideTorchrunsAgentStoreTheNextPort) {
  Env env(torchrun_with({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  EXPECT_EQ(hc::detect_launch().store, "tcp://10.0.0.7:29501");
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
  for (const char* bad : {"tcp://host", "tcp://:5", "tcp://host:", "tcp://host:99999", "tcp://host:5x"}) {
    l.store = bad;
    EXPECT_THROW(hc::launch_store(l, hc::Store::Seconds(0.1)), hopwise::InvalidArgument) << bad;
  }
}

}  // namespace
