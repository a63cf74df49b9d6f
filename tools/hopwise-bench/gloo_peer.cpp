#include "gloo_peer.h"

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "control.h"
#include "hopwise/common/error.h"

namespace hopwise::bench {

struct GlooPeer::State {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::string dir;
  int rank = 0;
};

GlooPeer::GlooPeer(Control& control) : s_(std::make_unique<State>()) {
  s_->rank = control.comm().rank();
  const int size = control.comm().size();
  std::string dir;
  if (s_->rank == 0) {
    dir = (std::filesystem::temp_directory_path() / "hopwise-gloo-XXXXXX").string();
    if (mkdtemp(dir.data()) == nullptr) throw Error("gloo peer: cannot create a rendezvous directory in /tmp");
  }
  s_->dir = control.broadcast(dir);
  gloo::rendezvous::FileStore store(s_->dir);
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto device = gloo::transport::tcp::CreateDevice(attr);
  s_->context = std::make_shared<gloo::rendezvous::Context>(s_->rank, size);
  s_->context->connectFullMesh(store, device);
  control.sync();
}

GlooPeer::~GlooPeer() {
  if (s_ && s_->rank == 0) {
    std::error_code ec;
    std::filesystem::remove_all(s_->dir, ec);
  }
}

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
