// Discovery of the machine this process runs on: hwloc for CPU packages, NUMA nodes, PCIe and NICs (hwloc's own XML
// export is read by this project's hwloc reader, so a live machine and a saved lstopo file are one code path); NIC
// speeds from sysfs; GPUs, NVLink and NVSwitches from NVML and the CUDA runtime, both loaded with dlopen at run time
// so that neither the build nor a GPU-less machine needs them. Without NVML, GPUs still come from their PCI class.
// No MPI here: comm/ gathers the per-rank views and cluster.h assembles them.
#pragma once

#include <string>

#include "hopwise/topology/graph.h"

namespace hopwise::topology {

// What the GPU probe found (for messages and tests).
struct GpuProbe {
  bool nvml_loaded = false;
  std::string nvml_note;  // why NVML was not used, or which library was
  int nvml_gpus = 0;      // GPUs NVML reported
  int nvlinks = 0;        // active NVLink lanes added
  bool cudart_loaded = false;
  int cuda_visible = 0;  // devices the CUDA runtime reports (after CUDA_VISIBLE_DEVICES)
};

// The whole local machine: hwloc + NIC speeds + GPUs. The Host node is named after gethostname().
// Throws hopwise::Error if hwloc itself fails.
Topology discover_machine(GpuProbe* probe = nullptr);

// Pieces of discover_machine, usable alone.
Topology discover_hwloc();
// Sets speed_gbps of NICs whose OS device is in <sysfs>/class/net (Mb/s) or <sysfs>/class/infiniband (port rate).
void add_nic_speeds(Topology& t, const std::string& sysfs_root = "/sys");
// Adds or completes GPUs with NVML: name, bus id, NVLink lanes to GPUs and NVSwitches. `library` (or
// HOPWISE_NVML_LIBRARY, else libnvidia-ml.so.1) is dlopen'ed; when absent nothing changes and probe says why.
// Then the CUDA runtime (libcudart, when loadable) gives each visible GPU its CUDA index (attribute "cuda_index").
GpuProbe add_gpus(Topology& t, const std::string& library = "");

// The CPUs this process may run on, as a Linux cpulist ("0-3,8"), from hwloc.
std::string process_cpus();

// Linux cpulist helpers: "0-3,8" <-> sorted CPU numbers. parse_cpulist throws InvalidArgument on malformed text.
std::vector<int> parse_cpulist(const std::string& list);
std::string format_cpulist(const std::vector<int>& cpus);

}  // namespace hopwise::topology
