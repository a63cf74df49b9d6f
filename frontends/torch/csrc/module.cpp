// hopwise.torch._C: the ProcessGroup class torch's creator returns, the hook states and the plan, for Python.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include "allreduce.h"
#include "averaging.h"
#include "hooks.h"
#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/common/log.h"
#include "hopwise/topology/planner.h"
#include "hopwise/training/elastic.h"
#include "monitor.h"
#include "sharded.h"

#include "backend.h"
#include "torch_store.h"
#include "translate.h"

namespace py = pybind11;
using hopwise::torch_backend::CodecHookState;
using hopwise::torch_backend::HopwiseBackend;
using hopwise::torch_backend::PowerSgdHookState;
using hopwise::torch_backend::ShardedCodecState;
using hopwise::torch_backend::TensorCodecState;
using hopwise::torch_backend::TorchAverager;
using hopwise::torch_backend::TorchMonitor;

namespace {

HopwiseBackend& hopwise_group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  // torch 2.x: the group holds a backend per device; hopwise's serves the CPU (and CUDA) tensors.
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = pg->getBackend(c10::DeviceType::CPU);
  } catch (const std::exception&) {
  }
  auto* h = dynamic_cast<HopwiseBackend*>(backend.get());
  TORCH_CHECK_VALUE(h != nullptr, "hopwise: this process group's CPU backend is '",
                    backend ? backend->getBackendName() : std::string("none"),
                    "', not hopwise; init_process_group(\"hopwise\") (or new_group(backend=\"hopwise\")) first");
  return *h;
}

// The plan the group's collectives follow, for people and programs.
py::dict plan_of(HopwiseBackend& pg) {
  auto& c = pg.communicator();
  py::dict d;
  d["rank"] = c.rank();
  d["size"] = c.size();
  d["transport"] = c.transport().name();
  d["local_size"] = c.local_size();
  d["ring"] = c.ring_order();
  d["channels"] = c.ring_channels();
  d["description"] = c.plan_description();
  py::dict algos;
  for (std::size_t bytes = 4 << 10; bytes <= (64u << 20); bytes *= 4)
    algos[py::int_(bytes)] =
        std::string(hopwise::comm::to_string(c.algorithm_for(hopwise::comm::Collective::kAllreduce, bytes)));
  d["allreduce_algorithm"] = algos;
  if (const auto* cluster = c.cluster()) {
    // The planner is deterministic: planning again gives the plan the communicator took, with its figures.
    const auto plan = hopwise::topology::plan_collectives(cluster->topology, cluster->placement);
    py::list edges;
    for (std::size_t i = 0; i < plan.ring_edges.size(); ++i) {
      py::dict e;
      e["from"] = plan.ring[i];
      e["to"] = plan.ring[(i + 1) % plan.ring.size()];
      e["hops"] = plan.ring_edges[i].hops;
      e["gbps"] = plan.ring_edges[i].bandwidth_gbps;
      edges.append(e);
    }
    d["hosts"] = cluster->hosts;
    d["ring_edges"] = edges;
    d["bottleneck_gbps"] = plan.ring_score.bottleneck_gbps;
    d["exact"] = plan.exact;
  }
  return d;
}

// Rank 0's `text` on every rank of MPI_COMM_WORLD (on a duplicate of it, so that it never meets other traffic):
// how the ranks of an mpirun job agree on torch's store address (hopwise/torch/launch.py). Collective.
std::string mpi_broadcast(const std::string& text) {
  return hopwise::torch_backend::translated([&] {
    hopwise::comm::ensure_mpi_initialized();
    MPI_Comm comm = MPI_COMM_NULL;
    hopwise::comm::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup (store address)");
    std::string out = text;
    long long n = static_cast<long long>(out.size());
    int rc = MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
    if (rc == MPI_SUCCESS) {
      out.resize(static_cast<std::size_t>(n));
      rc = MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
    }
    MPI_Comm_free(&comm);
    hopwise::comm::check_mpi(rc, "MPI_Bcast (store address)");
    return out;
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "hopwise's c10d backend and DDP comm hook states (use the hopwise.torch package)";
  py::module::import("torch.distributed");  // torch's ProcessGroup, Store and Work bindings, which these extend
  m.attr("HAS_CUDA") = static_cast<bool>(HOPWISE_TORCH_CUDA);  // CUDA tensors go through the device communicator

  py::class_<HopwiseBackend, c10d::Backend, c10::intrusive_ptr<HopwiseBackend>>(m, "HopwiseBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::duration<float> timeout, std::string group_id, std::vector<int64_t> ranks,
                       int world_rank, int world_size) {
             return c10::make_intrusive<HopwiseBackend>(store, rank, size, timeout, std::move(group_id),
                                                        std::move(ranks), world_rank, world_size);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_id") = "",
           py::arg("global_ranks") = std::vector<int64_t>{}, py::arg("world_rank") = -1, py::arg("world_size") = -1,
           py::call_guard<py::gil_scoped_release>());

  m.def("_mpi_broadcast", &mpi_broadcast, py::arg("text"), py::call_guard<py::gil_scoped_release>(),
        "Rank 0's text on every rank of the mpirun job (collective over MPI_COMM_WORLD)");
  m.def("plan", [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) { return plan_of(hopwise_group(pg)); });
  m.def("stats", [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
    auto& h = hopwise_group(pg);
    const auto s = h.communicator().stats();
    // The communicator counts a compressed call's user bytes like a plain call's and its payload apart: on the
    // wire, the payload replaces them.
    const std::uint64_t compressed = std::min(h.compressed_user_bytes(), s.bytes);
    py::dict d;
    d["calls"] = s.calls;
    d["bytes"] = s.bytes - compressed + s.wire_bytes;  // on the wire: plain calls' bytes, compressed ones' payloads
    d["user_bytes"] = s.bytes;                         // the buffers passed, compressed or not
    d["wire_bytes"] = s.wire_bytes;                    // the compressed calls' payloads (and scales)
    const auto sent = h.communicator().link_bytes();
    d["sent_bytes"] = sent.host + sent.network;  // what this rank's transport sent, every call and algorithm
    return d;
  });

  py::class_<CodecHookState, std::shared_ptr<CodecHookState>>(m, "CodecHookState")
      .def(py::init<const std::string&, int, int>(), py::arg("spec"), py::arg("rank"), py::arg("size"))
      .def_property_readonly("spec", &CodecHookState::spec)
      .def(
          "allreduce",
          [](CodecHookState& s, const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& buffer,
             const std::vector<at::Tensor>& gradients, const std::vector<int64_t>& keys, int64_t bucket) {
            return c10::intrusive_ptr<c10d::Work>(s.allreduce(hopwise_group(pg), buffer, gradients, keys, bucket));
          },
          py::call_guard<py::gil_scoped_release>())
      .def("save", [](const CodecHookState& s) { return py::bytes(s.save()); })
      .def("load", [](CodecHookState& s, const py::bytes& b) { s.load(std::string(b)); });

  m.def(
      "parse_averaging",
      [](const std::string& spec) {
        const auto s = hopwise::torch_backend::translated([&] { return hopwise::comm::AveragingSpec::parse(spec); });
        py::dict d;
        d["method"] = s.method;
        d["period"] = s.period;
        d["warmup"] = s.warmup;
        d["peers"] = s.peers;
        d["codec"] = s.codec;
        d["delay"] = s.delay;
        d["outer_lr"] = s.outer_lr;
        d["momentum"] = s.momentum;
        d["nesterov"] = s.nesterov;
        d["fragments"] = s.fragments;
        d["alpha"] = s.alpha;
        d["auto"] = s.pick != 0;
        d["target"] = s.target;
        d["inner"] = s.inner;
        d["spec"] = s.to_string();
        return d;
      },
      py::arg("spec"));
  m.def("set_console_line_open", &hopwise::log::set_console_line_open, py::arg("open"),
        "A progress bar left the console's line open (True) or ended it (False): hopwise's warnings and the "
        "monitor's lines end an open line first.");
  m.def("gossip_partner", &hopwise::comm::gossip_partner, py::arg("position"), py::arg("n"), py::arg("round"));
  m.def(
      "elastic_agree",
      [](const c10::intrusive_ptr<c10d::Store>& store, std::int64_t generation, int id, const std::vector<int>& members,
         const std::string& mode, double timeout_s, const std::string& why) {
        hopwise::torch_backend::TorchStore s(store);
        return hopwise::torch_backend::translated([&] {
          const auto options = hopwise::comm::ElasticOptions::parse(mode);
          return hopwise::comm::agree_on_survivors(s, generation, id, members, options,
                                                   hopwise::comm::Store::Seconds(timeout_s), why);
        });
      },
      py::arg("store"), py::arg("generation"), py::arg("id"), py::arg("members"), py::arg("mode"), py::arg("timeout_s"),
      py::arg("why"), py::call_guard<py::gil_scoped_release>(),
      "The survivors' agreement (hopwise/training/elastic.h): the next generation's members, alike on every survivor.");

  py::class_<hopwise::comm::ElasticHeartbeat>(m, "ElasticHeartbeat",
                                              "This member's sign of life in the store (hopwise/training/elastic.h): "
                                              "beats from a thread until the object is dropped.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int id, const std::string& mode) {
             return hopwise::torch_backend::translated([&] {
               return std::make_unique<hopwise::comm::ElasticHeartbeat>(
                   std::make_shared<hopwise::torch_backend::TorchStore>(store), id,
                   hopwise::comm::ElasticOptions::parse(mode).heartbeat_period());
             });
           }),
           py::arg("store"), py::arg("id"), py::arg("mode"));

  py::class_<TorchMonitor, std::shared_ptr<TorchMonitor>>(m, "Monitor")
      .def(py::init([](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& spec, double util_alert,
                       const std::string& metrics_file, const std::string& metrics_json, const std::string& job) {
             return hopwise::torch_backend::translated([&] {
               // The spec as given; the threshold and the files from the arguments, else the environment's.
               const hopwise::comm::MonitorOptions env = hopwise::comm::MonitorOptions::from_env();
               hopwise::comm::MonitorOptions o = hopwise::comm::MonitorOptions::parse(spec);
               o.util_alert = util_alert >= 0 ? util_alert : env.util_alert;
               o.metrics_file = metrics_file.empty() ? env.metrics_file : metrics_file;
               o.json_file = metrics_json.empty() ? env.json_file : metrics_json;
               o.job = job;
               return std::make_shared<TorchMonitor>(pg, hopwise_group(pg), o);
             });
           }),
           py::arg("group"), py::arg("spec"), py::arg("util_alert"), py::arg("metrics_file"), py::arg("metrics_json"),
           py::arg("job"))
      .def(
          "step", [](TorchMonitor& m) { hopwise::torch_backend::translated([&] { m.step(); }); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "finish", [](TorchMonitor& m) { hopwise::torch_backend::translated([&] { m.finish(); }); },
          py::call_guard<py::gil_scoped_release>())
      .def("last_sample",
           [](const TorchMonitor& m) {
             py::dict d;
             d["step_ms"] = m.last_sample().step_ms;
             d["compute_ms"] = m.last_sample().compute_ms;
             d["exposed_ms"] = m.last_sample().exposed_ms;
             d["bucket_ms"] = m.last_sample().bucket_ms;
             return d;
           })
      .def_property_readonly("alerts", [](const TorchMonitor& m) { return m.monitor().alerts(); })
      .def_property_readonly("reports", [](const TorchMonitor& m) {
        py::list out;
        for (const auto& r : m.monitor().reports()) {
          py::dict d;
          d["first_step"] = r.first_step;
          d["steps"] = r.steps;
          d["seconds"] = r.seconds;
          d["utilization"] = r.utilization;
          d["step_ms"] = r.step_ms;
          d["compute_ms"] = r.compute_ms;
          d["exposed_ms"] = r.exposed_ms;
          d["codec_ms"] = r.codec_ms;
          d["lag_ms"] = r.lag_ms;
          d["slowest_rank"] = r.slowest_rank;
          d["slowest_lag_ms"] = r.slowest_lag_ms;
          d["cause"] = r.cause;
          d["line"] = hopwise::comm::monitor_line(r);
          out.append(d);
        }
        return out;
      });

  py::class_<TorchAverager, std::shared_ptr<TorchAverager>>(m, "ModelAverager")
      .def(py::init([](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& spec, at::Tensor flat,
                       hopwise::torch_backend::StagingCall fetch, hopwise::torch_backend::StagingCall publish,
                       bool joining) {
             return std::make_shared<TorchAverager>(pg, hopwise_group(pg), spec, std::move(flat), std::move(fetch),
                                                    std::move(publish), joining);
           }),
           py::arg("group"), py::arg("spec"), py::arg("flat"), py::arg("fetch") = py::none(),
           py::arg("publish") = py::none(), py::arg("joining") = false, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("regroups", &TorchAverager::regroups)
      .def("detach", &TorchAverager::detach, py::call_guard<py::gil_scoped_release>())
      .def(
          "regroup",
          [](TorchAverager& a, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
            return a.regroup(pg, hopwise_group(pg));
          },
          py::arg("group"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("spec", &TorchAverager::spec)
      .def_property_readonly("steps", &TorchAverager::steps)
      .def("gradient_scope", &TorchAverager::gradient_scope)
      .def("before_step", &TorchAverager::before_step, py::call_guard<py::gil_scoped_release>())
      .def("after_step", &TorchAverager::after_step, py::call_guard<py::gil_scoped_release>())
      .def("full_average", &TorchAverager::full_average, py::call_guard<py::gil_scoped_release>())
      .def("settle", &TorchAverager::settle, py::call_guard<py::gil_scoped_release>())
      .def("mean_model", &TorchAverager::mean_model, py::call_guard<py::gil_scoped_release>())
      .def(
          "average_bucket",
          [](TorchAverager& a, const at::Tensor& b) { return c10::intrusive_ptr<c10d::Work>(a.average_bucket(b)); },
          py::call_guard<py::gil_scoped_release>())
      .def("average_gradients", &TorchAverager::average_gradients, py::call_guard<py::gil_scoped_release>())
      .def("stats",
           [](const TorchAverager& a) {
             py::dict d;
             const auto& s = a.stats();
             d["averages"] = s.averages;
             d["bytes"] = s.bytes;
             d["wait_ms"] = s.wait_ms;
             d["syncs"] = s.syncs;
             d["comm_ms"] = s.comm_ms;
             d["hidden_ms"] = s.hidden_ms;
             d["state_bytes"] = s.state_bytes;
             return d;
           })
      .def("choice", &TorchAverager::choice)
      .def("pick", &TorchAverager::pick)
      // Binary (the outer path's synced model, momentum, residuals): bytes to Python; load takes bytes, or the
      // str an older build's save() returned.
      .def("save",
           [](const TorchAverager& a) {
             std::string saved;
             {
               py::gil_scoped_release release;  // a fragment's average in flight is awaited
               saved = a.save();
             }
             return py::bytes(saved);
           })
      .def("load", [](TorchAverager& a, const py::object& saved) {
        TORCH_CHECK_VALUE(py::isinstance<py::bytes>(saved) || py::isinstance<py::str>(saved),
                          "hopwise: ModelAverager.load takes the bytes save() returned, not ",
                          std::string(py::str(py::type::handle_of(saved).attr("__name__"))));
        const std::string s =
            py::isinstance<py::bytes>(saved) ? std::string(saved.cast<py::bytes>()) : saved.cast<std::string>();
        py::gil_scoped_release release;
        hopwise::torch_backend::translated([&] { a.load(s); });
      });

  // hopwise.torch.allreduce's codec state (hopwise/torch/compressed.py keeps one in each CodecState).
  py::class_<TensorCodecState, std::shared_ptr<TensorCodecState>>(m, "TensorCodecState")
      .def(py::init<const std::string&, int, int, std::uint64_t>(), py::arg("spec"), py::arg("rank"), py::arg("size"),
           py::arg("seed"))
      .def_property_readonly("spec", &TensorCodecState::spec)
      .def_property_readonly("rank", &TensorCodecState::rank)
      .def_property_readonly("size", &TensorCodecState::size)
      .def_property_readonly("step", &TensorCodecState::step)
      .def_property_readonly("seed", &TensorCodecState::seed)
      .def_property_readonly("numel", &TensorCodecState::numel)
      .def_property_readonly("busy", &TensorCodecState::busy)
      .def("residual",
           [](const TensorCodecState& s) -> std::optional<at::Tensor> {
             auto r = s.residual();
             if (!r) return std::nullopt;
             return at::tensor(*r, at::kFloat);
           })
      .def(
          "allreduce",
          [](TensorCodecState& s, const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& tensor,
             const std::string& op) {
            return c10::intrusive_ptr<c10d::Work>(s.allreduce(hopwise_group(pg), tensor, op));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "set",
          [](TensorCodecState& s, std::uint64_t step, std::uint64_t seed, int64_t numel,
             const std::optional<at::Tensor>& residual) {
            std::optional<std::vector<float>> r;
            if (residual) {
              const at::Tensor t = residual->to(at::kCPU, at::kFloat).contiguous();
              r.emplace(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
            }
            s.set(step, seed, numel, std::move(r));
          },
          py::arg("step"), py::arg("seed"), py::arg("numel"), py::arg("residual"))
      .def("reset", &TensorCodecState::reset)
      .def_static("canonical", &TensorCodecState::canonical, py::arg("spec"));

  m.def("codecs_for_models", [] { return hopwise::compression::codecs_for_models(); });

  py::class_<ShardedCodecState, std::shared_ptr<ShardedCodecState>>(m, "ShardedCodecState")
      .def(py::init<const std::string&, int, int, std::uint64_t>(), py::arg("spec"), py::arg("rank"), py::arg("size"),
           py::arg("seed"))
      .def_property_readonly("spec", &ShardedCodecState::spec)
      .def_property_readonly("step", &ShardedCodecState::step)
      .def_property_readonly("numel", &ShardedCodecState::numel)
      .def_property_readonly("busy", &ShardedCodecState::busy)
      .def("residuals",
           [](const ShardedCodecState& s) {
             std::vector<std::optional<at::Tensor>> out;
             for (const auto& r : s.residuals())
               out.push_back(r ? std::optional(at::tensor(*r, at::kFloat)) : std::nullopt);
             return out;
           })
      .def(
          "reduce_scatter",
          [](ShardedCodecState& s, const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& output,
             const at::Tensor& input, const c10d::ReduceOp& op) {
            return c10::intrusive_ptr<c10d::Work>(s.reduce_scatter(hopwise_group(pg), output, input, op));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "all_gather",
          [](ShardedCodecState& s, const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& output,
             const at::Tensor& input) {
            return c10::intrusive_ptr<c10d::Work>(s.all_gather(hopwise_group(pg), output, input));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "set",
          [](ShardedCodecState& s, std::uint64_t step, int64_t numel,
             const std::vector<std::optional<at::Tensor>>& residuals) {
            std::vector<std::optional<std::vector<float>>> r;
            for (const auto& t : residuals) {
              if (!t) {
                r.emplace_back();
                continue;
              }
              const at::Tensor c = t->to(at::kCPU, at::kFloat).contiguous();
              r.emplace_back(std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel()));
            }
            s.set(step, numel, r);
          },
          py::arg("step"), py::arg("numel"), py::arg("residuals"));

  py::class_<PowerSgdHookState, std::shared_ptr<PowerSgdHookState>>(m, "PowerSgdHookState")
      .def(py::init<const std::string&>(), py::arg("spec"))
      .def_property_readonly("spec", &PowerSgdHookState::spec)
      .def(
          "allreduce",
          [](PowerSgdHookState& s, const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& buffer,
             const std::vector<at::Tensor>& gradients, const std::vector<int64_t>& keys) {
            return c10::intrusive_ptr<c10d::Work>(s.allreduce(hopwise_group(pg), buffer, gradients, keys));
          },
          py::call_guard<py::gil_scoped_release>())
      .def("save", [](const PowerSgdHookState& s) { return py::bytes(s.save()); })
      .def("load", [](PowerSgdHookState& s, const py::bytes& b) { s.load(std::string(b)); });
}
