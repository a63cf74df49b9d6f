// gpu-codec-bench: each CUDA kernel (reductions, every codec's encode and decode) timed against a device-to-device
// copy of the same bytes, in one run. GB/s counts the float32 gradient bytes a call consumes (encode) or produces
// (decode), so a kernel and the copy of its gradient are compared on the same bytes; "% copy" is their ratio.
//
//   gpu-codec-bench [--sizes 1M,16M,64M,256M] [--reps 20] [--codecs none,fp16,...] [--csv FILE]
// Exit status 2 where no GPU is visible.
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "hopwise/common/cuda_check.h"
#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/device_codec.h"
#include "hopwise/compression/device_powersgd.h"

namespace {

namespace hc = hopwise::compression;
using hopwise::DeviceBuffer;

using hopwise::cuda::check;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t end = std::min(s.find(',', start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Median time in microseconds of `reps` calls of f on `stream`, each bracketed by events, after two warm-ups.
template <class F>
double median_us(cudaStream_t stream, int reps, F f) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, stream), "cudaEventRecord");
    f();
    check(cudaEventRecord(b, stream), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms * 1000.0);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string kernel, op;
  std::size_t bytes;
  double us, copy_us;
};

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::size_t> sizes = {1 << 20, 16 << 20, 64 << 20, 256 << 20};
  int reps = 20;
  std::vector<std::string> codecs = {"none", "fp16",     "bf16",      "int8",      "int8:round=stochastic",
                                     "qsgd", "terngrad", "sign:ef=0", "topk:ef=0", "randomk:ef=0",
                                     "topk", "sign"};
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw hopwise::InvalidArgument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--sizes") {
      sizes.clear();
      for (const auto& s : split(next())) sizes.push_back(hopwise::env::parse_size(s, "--sizes"));
    } else if (a == "--reps") {
      reps = std::max(1, std::stoi(next()));
    } else if (a == "--codecs") {
      codecs = split(next());
    } else if (a == "--csv") {
      csv = next();
    } else {
      std::fprintf(stderr, "usage: gpu-codec-bench [--sizes 1M,64M] [--reps N] [--codecs a,b] [--csv FILE]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  std::string why;
  if (hopwise::cuda::device_count(&why) == 0) {
    std::fprintf(stderr, "gpu-codec-bench: needs a CUDA GPU: %s\n", why.c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");

  const std::size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  const std::size_t max_n = max_bytes / sizeof(float);
  // Random normal gradients, made once on the host.
  std::vector<float> host(max_n);
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : host) v = normal(rng);
  DeviceBuffer grad(max_bytes), other(max_bytes), out(max_bytes), copy(max_bytes), payload(max_bytes + 64),
      scales(max_bytes / 16 + 64);
  hopwise::cuda::copy_to_device(grad.data(), host.data(), max_bytes);
  hopwise::cuda::copy_to_device(other.data(), host.data(), max_bytes);

  std::vector<Row> rows;
  for (std::size_t bytes : sizes) {
    const std::size_t n = bytes / sizeof(float);
    const double copy_us = median_us(s, reps, [&] {
      check(cudaMemcpyAsync(copy.data(), grad.data(), bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    });
    // Reductions: dst = a + b reads two buffers, so its bytes are those of one input (the copy's unit).
    rows.push_back({"reduce float32 sum", "dst=a+b", bytes,
                    median_us(s, reps,
                              [&] {
                                hopwise::cuda::reduce_into(hopwise::DataType::kFloat32, hopwise::ReduceOp::kSum,
                                                           out.data(), grad.data(), other.data(), n, s);
                              }),
                    copy_us});
    rows.push_back({"reduce bfloat16 sum", "dst=a+b", bytes,
                    median_us(s, reps,
                              [&] {
                                hopwise::cuda::reduce_into(hopwise::DataType::kBFloat16, hopwise::ReduceOp::kSum,
                                                           out.data(), grad.data(), other.data(), bytes / 2, s);
                              }),
                    copy_us});
    for (const std::string& spec : codecs) {
      const hc::DeviceCodec codec(spec);
      hc::DeviceCodecState st(7, 0, 1);
      const bool scaled = codec.host().scale_count(n) > 0;
      auto encode = [&] {
        if (scaled) codec.local_scales(grad.as<float>(), n, scales.as<float>(), st, s);
        codec.encode(grad.as<float>(), n, payload.as<std::byte>(), st, scales.as<float>(), s);
      };
      const double enc = median_us(s, reps, encode);
      const double dec = median_us(
          s, reps, [&] { codec.decode(payload.as<std::byte>(), n, out.as<float>(), st, scales.as<float>(), s); });
      rows.push_back({codec.name(), "encode", bytes, enc, copy_us});
      rows.push_back({codec.name(), "decode", bytes, dec, copy_us});
    }
    // PowerSGD on a 4096-row matrix of the same bytes: one step's three calls (one rank: the sums are the factors).
    if (n >= 4096 * 8) {
      const std::size_t r = 4096, c = n / 4096;
      const auto ps = hc::DevicePowerSgd::from_spec("powersgd:rank=4");
      hc::DevicePowerSgdState st(7);
      const std::size_t pn = ps.host().p_count(r, c);
      const double us = median_us(s, reps, [&] {
        ps.compute_p(grad.as<float>(), r, c, payload.as<float>(), st, s);
        ps.compute_q(payload.as<float>(), r, c, payload.as<float>() + pn, st, s);
        ps.decompress(payload.as<float>() + pn, r, c, out.as<float>(), st, s);
      });
      rows.push_back({ps.host().name() + fmt::format(" ({}x{})", r, c), "p, q, out", r * c * 4, us, copy_us});
    }
  }

  fmt::print(
      "gpu-codec-bench on {} ({} SMs), median of {} calls; GB/s of float32 gradient bytes; copy = "
      "cudaMemcpyAsync device-to-device of the same bytes, same run\n\n",
      prop.name, prop.multiProcessorCount, reps);
  fmt::print(
      "| kernel | op | MiB | µs | GB/s | copy GB/s | % copy | ≥ 70% (≥ 64 MiB) "
      "|\n|---|---|---:|---:|---:|---:|---:|---|\n");
  int missed = 0;
  for (const Row& r : rows) {
    const double gbs = static_cast<double>(r.bytes) / r.us / 1e3,
                 copy_gbs = static_cast<double>(r.bytes) / r.copy_us / 1e3;
    const double pct = 100.0 * r.copy_us / r.us;
    std::string target = "";
    if (r.bytes >= (64u << 20) && r.kernel.rfind("reduce", 0) != 0) {
      target = pct >= 70.0 ? "yes" : "no";
      missed += pct < 70.0;
    }
    fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.0f}% | {} |\n", r.kernel, r.op, r.bytes >> 20, r.us, gbs,
               copy_gbs, pct, target);
  }
  fmt::print("\ncodec rows at >= 64 MiB below 70% of copy: {}\n", missed);
  if (!csv.empty()) {
    std::ofstream f(csv);
    f << "kernel,op,bytes,us,gbs,copy_gbs,pct_copy\n";
    for (const Row& r : rows)
      f << '"' << r.kernel << "\"," << r.op << ',' << r.bytes << ',' << r.us << ','
        << static_cast<double>(r.bytes) / r.us / 1e3 << ',' << static_cast<double>(r.bytes) / r.copy_us / 1e3 << ','
        << 100.0 * r.copy_us / r.us << '\n';
  }
  cudaStreamDestroy(s);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpu-codec-bench: %s\n", e.what());
  return 1;
}
