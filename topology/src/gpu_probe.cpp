// GPUs, NVLink and NVSwitches from NVML; CUDA indices from the CUDA runtime. Both are dlopen'ed: the build links
// neither, and a machine without a GPU driver simply keeps the GPUs hwloc found by PCI class.
#include <dlfcn.h>
#include <fmt/core.h>

#include <map>
#include <string>

#include "hopwise/common/env.h"
#include "hopwise/topology/discover.h"

namespace hopwise::topology {

namespace {

// The few NVML types used, as its stable C ABI defines them (nvml.h is not needed to build).
using NvmlDevice = void*;
struct NvmlPciInfo {  // nvmlPciInfo_t, as filled by the _v3 / _v2 entry points used below
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
constexpr int kNvmlSuccess = 0;
constexpr unsigned kMaxNvLinks = 18;  // NVML_NVLINK_MAX_LINKS
constexpr int kRemoteGpu = 0, kRemoteSwitch = 2;

class Library {
 public:
  explicit Library(const std::string& name) : h_(dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {}
  ~Library() {
    if (h_) dlclose(h_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  explicit operator bool() const { return h_ != nullptr; }
  template <class F>
  F get(const char* sym) const {
    return h_ ? reinterpret_cast<F>(dlsym(h_, sym)) : nullptr;
  }

 private:
  void* h_;
};

// GB/s per NVLink lane and direction, as NCCL's topology model assumes per GPU generation.
double per_link_gbps(int sm) { return sm >= 100 ? 40.0 : sm >= 90 ? 20.6 : 20.0; }

int find_or_add_gpu(Topology& t, const std::string& bus, const std::string& model, int nvml_index) {
  if (auto id = t.find_by_bus_id(bus)) {
    Node& n = t.node(*id);
    if (n.kind == NodeKind::Gpu) {
      if (!model.empty()) n.model = model;
      return *id;
    }
  }
  // NVML sees a GPU hwloc did not (filtered I/O, a container): hang it off the first host.
  Node n;
  n.kind = NodeKind::Gpu;
  n.pci_bus_id = bus;
  n.model = model;
  n.index = nvml_index;
  n.name = fmt::format("GPU{}", t.count(NodeKind::Gpu));
  const int id = t.add_node(std::move(n));
  const auto hosts = t.nodes_of(NodeKind::Host);
  if (!hosts.empty()) t.add_link({hosts.front(), id, LinkKind::PCIe, 1, 0, 0, 0, 0});
  return id;
}

void probe_nvml(Topology& t, const std::string& library, GpuProbe& out) {
  const Library lib(library);
  if (!lib) {
    out.nvml_note = fmt::format("NVML not loaded ({}): {}", library, dlerror());
    return;
  }
  auto init = lib.get<int (*)()>("nvmlInit_v2");
  auto shutdown = lib.get<int (*)()>("nvmlShutdown");
  auto count = lib.get<int (*)(unsigned*)>("nvmlDeviceGetCount_v2");
  auto handle = lib.get<int (*)(unsigned, NvmlDevice*)>("nvmlDeviceGetHandleByIndex_v2");
  auto name = lib.get<int (*)(NvmlDevice, char*, unsigned)>("nvmlDeviceGetName");
  auto pci = lib.get<int (*)(NvmlDevice, NvmlPciInfo*)>("nvmlDeviceGetPciInfo_v3");
  auto link_state = lib.get<int (*)(NvmlDevice, unsigned, int*)>("nvmlDeviceGetNvLinkState");
  auto remote_pci = lib.get<int (*)(NvmlDevice, unsigned, NvmlPciInfo*)>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
  auto remote_type = lib.get<int (*)(NvmlDevice, unsigned, int*)>("nvmlDeviceGetNvLinkRemoteDeviceType");
  auto capability = lib.get<int (*)(NvmlDevice, int*, int*)>("nvmlDeviceGetCudaComputeCapability");
  if (!init || !shutdown || !count || !handle || !pci) {
    out.nvml_note = fmt::format("{} lacks nvmlInit_v2/nvmlDeviceGetCount_v2/nvmlDeviceGetPciInfo_v3", library);
    return;
  }
  if (const int rc = init(); rc != kNvmlSuccess) {
    out.nvml_note = fmt::format("nvmlInit_v2 failed with NVML error {} (no driver?)", rc);
    return;
  }
  out.nvml_loaded = true;
  out.nvml_note = "NVML from " + library;
  unsigned n = 0;
  if (count(&n) != kNvmlSuccess) n = 0;
  std::map<std::string, int> gpu_by_bus;  // normalised bus id -> node
  std::map<int, NvmlDevice> devices;      // node -> NVML handle
  std::map<int, int> sm_of;
  for (unsigned i = 0; i < n; ++i) {
    NvmlDevice d = nullptr;
    NvmlPciInfo info{};
    if (handle(i, &d) != kNvmlSuccess || pci(d, &info) != kNvmlSuccess) continue;
    char model[96] = {};
    if (name) name(d, model, sizeof model - 1);
    const std::string bus = normalize_bus_id(info.bus_id);
    const int id = find_or_add_gpu(t, bus, model, static_cast<int>(i));
    int major = 0, minor = 0;
    if (capability && capability(d, &major, &minor) == kNvmlSuccess) {
      sm_of[id] = major * 10 + minor;
      t.node(id).attrs["sm"] = std::to_string(sm_of[id]);
    }
    t.node(id).attrs["nvml_index"] = std::to_string(i);
    gpu_by_bus[bus] = id;
    devices[id] = d;
    ++out.nvml_gpus;
  }
  // NVLink lanes, bonded per peer: GPU<->GPU counted from the lower node id only (both ends report them).
  if (link_state && remote_pci) {
    std::map<std::pair<int, int>, int> lanes;
    for (const auto& [id, d] : devices) {
      for (unsigned l = 0; l < kMaxNvLinks; ++l) {
        int active = 0;
        NvmlPciInfo info{};
        if (link_state(d, l, &active) != kNvmlSuccess || !active) continue;
        if (remote_pci(d, l, &info) != kNvmlSuccess) continue;
        const std::string bus = normalize_bus_id(info.bus_id);
        int type = -1;
        if (remote_type && remote_type(d, l, &type) != kNvmlSuccess) type = -1;
        const auto peer = gpu_by_bus.find(bus);
        if (type == kRemoteGpu || (type < 0 && peer != gpu_by_bus.end())) {
          if (peer != gpu_by_bus.end() && id < peer->second) ++lanes[{id, peer->second}];
        } else if (type == kRemoteSwitch || type < 0) {
          int sw = -1;
          if (auto found = t.find_by_bus_id(bus); found && t.node(*found).kind == NodeKind::NvSwitch) {
            sw = *found;
          } else {
            Node s;
            s.kind = NodeKind::NvSwitch;
            s.pci_bus_id = bus;
            s.name = "NVSwitch" + bus;
            sw = t.add_node(std::move(s));
          }
          ++lanes[{id, sw}];
        }
      }
    }
    for (const auto& [ends, c] : lanes) {
      const int sm = sm_of.count(ends.first) ? sm_of[ends.first] : 0;
      t.add_link({ends.first, ends.second, LinkKind::NVLink, c, 0, 0, c * per_link_gbps(sm), 0});
      out.nvlinks += c;
    }
  }
  shutdown();
}

void probe_cudart(Topology& t, GpuProbe& out) {
  for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) {
    const Library lib(name);
    if (!lib) continue;
    auto count = lib.get<int (*)(int*)>("cudaGetDeviceCount");
    auto bus_of = lib.get<int (*)(char*, int, int)>("cudaDeviceGetPCIBusId");
    if (!count || !bus_of) continue;
    out.cudart_loaded = true;
    int n = 0;
    if (count(&n) != 0) return;  // no driver or no device: keep PCI order
    for (const int id : t.nodes_of(NodeKind::Gpu))
      t.node(id).attrs.insert_or_assign("cuda_visible", std::string(1, '0'));
    for (int d = 0; d < n; ++d) {
      char bus[32] = {};
      if (bus_of(bus, sizeof bus - 1, d) != 0) continue;
      if (auto id = t.find_by_bus_id(normalize_bus_id(bus)); id && t.node(*id).kind == NodeKind::Gpu) {
        t.node(*id).index = d;
        t.node(*id).attrs["cuda_index"] = std::to_string(d);
        t.node(*id).attrs.insert_or_assign("cuda_visible", std::string(1, '1'));
        ++out.cuda_visible;
      }
    }
    return;
  }
}

}  // namespace

GpuProbe add_gpus(Topology& t, const std::string& library) {
  GpuProbe out;
  const std::string lib = !library.empty() ? library : env::get_or("HOPWISE_NVML_LIBRARY", "libnvidia-ml.so.1");
  probe_nvml(t, lib, out);
  // The CUDA runtime initialises the driver, which costs time: ask it only when there is a GPU to name.
  if (t.count(NodeKind::Gpu) > 0 && out.nvml_loaded) probe_cudart(t, out);
  return out;
}

}  // namespace hopwise::topology
