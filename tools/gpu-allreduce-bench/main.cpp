// gpu-allreduce-bench: allreduce of device buffers, one GPU per rank, beside its peers in the same run:
//   nccl       NCCL's own allreduce (DeviceAlgorithm::kNative)
//   ring       hopwise's ring of grouped ncclSend/ncclRecv along the planned ring order (kRing)
//   fp16, int8 compressed allreduce with the device codecs (payload allreduce + encode/decode kernels)
//   psgd       PowerSGD rank 4 on the buffer as a 4096-row matrix (DevicePowerSgdAllreduce: two factor allreduces)
//   mpi        MPI_Allreduce of the same bytes staged through host memory (copy down, allreduce, copy up)
//   copy       a device-to-device copy of the same bytes (the limit of one pass over the data)
// Times are medians of --iters sync calls after --warmup; busbw = bytes/time * 2(n-1)/n (nccl-tests' convention).
//   mpirun -np N gpu-allreduce-bench [-b 1M] [-e 256M] [-f 4] [--iters 20] [--warmup 3]
#include <cuda_runtime.h>
#include <fmt/core.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "hopwise/comm/device_communicator.h"
#include "hopwise/comm/device_powersgd_allreduce.h"
#include "hopwise/common/cuda_check.h"
#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/device_codec.h"

namespace {

namespace hc = hopwise::comm;
namespace hcc = hopwise::compression;

using hopwise::cuda::check;

// Median over ranks' slowest: each iteration is timed on every rank and the maximum taken.
template <class F>
double median_us(MPI_Comm comm, int warmup, int iters, F f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    MPI_Barrier(comm);
    const auto a = std::chrono::steady_clock::now();
    f();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, comm);
    t.push_back(us);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;  // the DeviceCommunicator's store serves from a thread on rank 0
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 0;
  try {
    std::size_t begin = 1 << 20, end = 256 << 20;
    int factor = 4, iters = 20, warmup = 3;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw hopwise::InvalidArgument(a + " needs a value");
        return argv[++i];
      };
      if (a == "-b")
        begin = hopwise::env::parse_size(next(), "-b");
      else if (a == "-e")
        end = hopwise::env::parse_size(next(), "-e");
      else if (a == "-f")
        factor = std::max(2, std::stoi(next()));
      else if (a == "--iters")
        iters = std::max(1, std::stoi(next()));
      else if (a == "--warmup")
        warmup = std::max(0, std::stoi(next()));
      else
        throw hopwise::InvalidArgument(
            "unknown argument '" + a +
            "'; usage: gpu-allreduce-bench [-b 1M] [-e 256M] [-f 4] [--iters N] [--warmup N]");
    }
    std::string why;
    int have = hopwise::cuda::device_count(&why) > 0 ? 1 : 0, all = 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
      std::fprintf(stderr, "gpu-allreduce-bench: needs a CUDA GPU on every rank%s%s\n", why.empty() ? "" : ": ",
                   why.c_str());
      MPI_Finalize();
      return 2;
    }
    hc::DeviceCommunicator dev(MPI_COMM_WORLD);
    const int n = dev.size();
    cudaStream_t s = static_cast<cudaStream_t>(dev.stream());
    hopwise::DeviceBuffer buf(end), copy(end);
    std::vector<char> host(end);
    check(cudaMemset(buf.data(), 0, end), "cudaMemset");
    const hcc::DeviceCodec fp16("fp16"), int8("int8");
    hcc::DeviceCodecState fp16_state(1, dev.rank(), n), int8_state(1, dev.rank(), n);
    hc::DevicePowerSgdAllreduce psgd(dev, "powersgd:rank=4");

    if (dev.rank() == 0) {
      cudaDeviceProp prop{};
      check(cudaGetDeviceProperties(&prop, dev.device()), "cudaGetDeviceProperties");
      int nccl_version = 0;
      ncclGetVersion(&nccl_version);  // e.g. 22903 for 2.29.3
      fmt::print(
          "gpu-allreduce-bench: {} ranks, rank 0 on {}; NCCL {}.{}.{}; float32 sum; median of {} calls; busbw GB/s\n\n",
          n, prop.name, nccl_version / 10000, nccl_version / 100 % 100, nccl_version % 100, iters);
      fmt::print(
          "| bytes | nccl µs | ring µs | fp16 µs | int8 µs | psgd r4 µs | mpi (host-staged) µs | copy µs | "
          "nccl busbw | ring/nccl | mpi/nccl |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    for (std::size_t bytes = begin; bytes <= end; bytes *= static_cast<std::size_t>(factor)) {
      const std::size_t count = bytes / sizeof(float);
      auto* d = buf.as<float>();
      dev.set_algorithm(hc::DeviceAlgorithm::kNative);
      const double t_nccl = median_us(MPI_COMM_WORLD, warmup, iters, [&] {
        dev.allreduce(d, d, count, hopwise::DataType::kFloat32, hopwise::ReduceOp::kSum);
      });
      dev.set_algorithm(hc::DeviceAlgorithm::kRing);
      const double t_ring = median_us(MPI_COMM_WORLD, warmup, iters, [&] {
        dev.allreduce(d, d, count, hopwise::DataType::kFloat32, hopwise::ReduceOp::kSum);
      });
      dev.set_algorithm(hc::DeviceAlgorithm::kNative);
      const double t_fp16 =
          median_us(MPI_COMM_WORLD, warmup, iters, [&] { dev.allreduce_compressed(d, d, count, fp16, fp16_state); });
      const double t_int8 =
          median_us(MPI_COMM_WORLD, warmup, iters, [&] { dev.allreduce_compressed(d, d, count, int8, int8_state); });
      // A fresh state per size (the matrix shape changes); its first call allocates, inside the warm-up.
      hcc::DevicePowerSgdState psgd_state(3);
      const hc::DevicePowerSgdTensor mat{d, d, 4096, count / 4096, &psgd_state};
      const double t_psgd = count >= 4096 * 8 ? median_us(MPI_COMM_WORLD, warmup, iters,
                                                          [&] {
                                                            psgd.allreduce({&mat, 1});
                                                          })
                                              : 0.0;
      const double t_mpi = median_us(MPI_COMM_WORLD, warmup, iters, [&] {
        check(cudaMemcpyAsync(host.data(), d, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        MPI_Allreduce(MPI_IN_PLACE, host.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        check(cudaMemcpyAsync(d, host.data(), bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      });
      const double t_copy = median_us(MPI_COMM_WORLD, warmup, iters, [&] {
        check(cudaMemcpyAsync(copy.data(), d, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      });
      if (dev.rank() == 0) {
        const double busbw = static_cast<double>(bytes) / t_nccl / 1e3 * (n > 1 ? 2.0 * (n - 1) / n : 1.0);
        fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} |\n",
                   bytes, t_nccl, t_ring, t_fp16, t_int8, t_psgd, t_mpi, t_copy, busbw, t_ring / t_nccl,
                   t_mpi / t_nccl);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu-allreduce-bench: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
