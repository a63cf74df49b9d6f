#include "gloo_peer.h"

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "control.h"
#include "hopwise/common/error.h"

namespace hopwise::bench {

namespace {

// Gloo's rendezvous over hopwise's store (the launch's TCP store under torchrun, an MpiStore under mpirun), so
// that its ranks meet on any hosts the job has, as torch's ProcessGroupGloo does through torch's store.
class StoreForGloo final : public gloo::rendezvous::Store {
 public:
  StoreForGloo(comm::Store& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_.get(prefix_ + key, kTimeout);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_.wait(full, timeout);
  }

 private:
  static constexpr std::chrono::seconds kTimeout{120};
  comm::Store& store_;
  std::string prefix_;
};

}  // namespace

struct GlooPeer::State {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::shared_ptr<comm::Store> store;
};

GlooPeer::GlooPeer(Control& control, std::shared_ptr<comm::Store> store, bool several_hosts)
    : s_(std::make_unique<State>()) {
  s_->store = std::move(store);
  const int rank = control.comm().rank(), size = control.comm().size();
  StoreForGloo gloo_store(*s_->store, "hopwise-bench/gloo/");
  // Across hosts Gloo listens on this host's name (its address on the job's network); within one, on loopback.
  char host[256] = "127.0.0.1";
  if (several_hosts) ::gethostname(host, sizeof host - 1);
  gloo::transport::tcp::attr attr(host);
  auto device = gloo::transport::tcp::CreateDevice(attr);
  s_->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  s_->context->connectFullMesh(gloo_store, device);
  control.sync();
}

GlooPeer::~GlooPeer() = default;

bool GlooPeer::supports(DataType dt, ReduceOp op) {
  return (dt == DataType::kFloat32 || dt == DataType::kFloat64) && op != ReduceOp::kAvg;
}

namespace {

template <class T>
gloo::AllreduceOptions::Func function_for(ReduceOp op) {
  using F = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case ReduceOp::kProd: return static_cast<F>(&gloo::product<T>);
    case ReduceOp::kMin: return static_cast<F>(&gloo::min<T>);
    case ReduceOp::kMax: return static_cast<F>(&gloo::max<T>);
    default: return static_cast<F>(&gloo::sum<T>);
  }
}

template <class T>
void run(const std::shared_ptr<gloo::rendezvous::Context>& ctx, const void* in, void* out, std::size_t count,
         ReduceOp op) {
  gloo::AllreduceOptions opts(ctx);
  opts.setInput(const_cast<T*>(static_cast<const T*>(in)), count);
  opts.setOutput(static_cast<T*>(out), count);
  opts.setReduceFunction(function_for<T>(op));
  gloo::allreduce(opts);
}

}  // namespace

void GlooPeer::allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  if (dt == DataType::kFloat64)
    run<double>(s_->context, in, out, count, op);
  else
    run<float>(s_->context, in, out, count, op);
}

}  // namespace hopwise::bench
