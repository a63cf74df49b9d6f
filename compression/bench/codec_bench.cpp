// codec-bench: encode and decode throughput of every codec on one core, in GB/s of float32 input, beside
// single-core memcpy of the same bytes measured in the same run.
//   codec-bench [--mib N] [--reps R] [--codec SPEC]...   (defaults: 64 MiB, best of 5, every codec's defaults)
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace hc = hopwise::compression;

template <class F>
double best_seconds(int reps, F f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

int usage(const std::string& msg) {
  fmt::print(stderr, "codec-bench: {}\nusage: codec-bench [--mib N] [--reps R] [--codec SPEC]...\n", msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  double mib = 64;
  int reps = 5;
  std::vector<std::string> specs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--mib" || a == "--reps" || a == "--codec") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--mib") {
        mib = std::atof(v.c_str());
        if (!(mib > 0)) return usage("--mib needs a positive number");
      } else if (a == "--reps") {
        reps = std::atoi(v.c_str());
        if (reps < 1) return usage("--reps needs a positive integer");
      } else {
        specs.push_back(v);
      }
    } else if (a == "-h" || a == "--help") {
      return usage("help");
    } else {
      return usage("unknown argument '" + a + "'");
    }
  }
  if (specs.empty())
    specs = {"none",           "fp16", "bf16",      "int8", "int8:round=stochastic", "qsgd",    "terngrad",
             "sign:ef=0",      "sign", "topk:ef=0", "topk", "randomk:ef=0",          "randomk", "powersgd:rank=4,ef=0",
             "powersgd:rank=4"};

  const std::size_t n = static_cast<std::size_t>(mib * 1024 * 1024 / sizeof(float));
  const double gb = static_cast<double>(n * sizeof(float)) / 1e9;
  std::vector<float> grad(n), out(n), copy(n);
  std::mt19937 rng(12345);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& g : grad) g = dist(rng);

  const double memcpy_s = best_seconds(reps, [&] { std::memcpy(copy.data(), grad.data(), n * sizeof(float)); });
  fmt::print("codec-bench: {} floats ({} MiB), best of {}, one core\n", n, mib, reps);
  fmt::print("{:<38} {:>12} {:>8} {:>12} {:>12} {:>14}\n", "codec", "pattern", "ratio", "encode GB/s", "decode GB/s",
             "memcpy GB/s");
  fmt::print("{:<38} {:>12} {:>8} {:>12} {:>12} {:>14.2f}\n", "memcpy", "-", "1.00", "-", "-", gb / memcpy_s);
  for (const auto& text : specs) {
    if (text.rfind("powersgd", 0) == 0) {
      // As one rank: a 4096-row matrix; encode = compute_p + compute_q, decode = decompress. Ratio: n / (P + Q).
      const std::size_t rows = 4096, cols = n / rows;
      std::unique_ptr<hc::PowerSgd> ps;
      try {
        ps = std::make_unique<hc::PowerSgd>(hc::PowerSgd::from_spec(text));
      } catch (const hopwise::InvalidArgument& e) {
        fmt::print(stderr, "codec-bench: {}\n", e.what());
        return 2;
      }
      std::vector<float> p(ps->p_count(rows, cols)), q(ps->q_count(rows, cols));
      hc::PowerSgdState st(1);
      double enc = 1e30, dec = 1e30;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        ps->compute_p(grad.data(), rows, cols, p.data(), st);
        ps->compute_q(p.data(), rows, cols, q.data(), st);
        const auto t1 = Clock::now();
        ps->decompress(q.data(), rows, cols, out.data(), st);
        const auto t2 = Clock::now();
        enc = std::min(enc, std::chrono::duration<double>(t1 - t0).count());
        dec = std::min(dec, std::chrono::duration<double>(t2 - t1).count());
      }
      const double gbm = static_cast<double>(rows * cols * sizeof(float)) / 1e9;
      fmt::print("{:<38} {:>12} {:>8.1f} {:>12.2f} {:>12.2f} {:>14.2f}\n", ps->name() + " (4096 rows)", "2 allreduces",
                 static_cast<double>(rows * cols) / static_cast<double>(p.size() + q.size()), gbm / enc, gbm / dec,
                 gb / memcpy_s);
      continue;
    }
    std::unique_ptr<hc::Codec> codec;
    try {
      codec = hc::make_codec(text);
    } catch (const hopwise::InvalidArgument& e) {
      fmt::print(stderr, "codec-bench: {}\n", e.what());
      return 2;
    }
    std::vector<std::byte> payload(codec->payload_bytes(n));
    std::vector<float> scales(codec->scale_count(n));
    hc::CodecState state(1, 0, 1);
    // encode includes local_scales for codecs that agree on scales (int8), as one rank would compute them.
    const double enc = best_seconds(reps, [&] {
      if (!scales.empty()) codec->local_scales(grad.data(), n, scales.data(), state);
      codec->encode(grad.data(), n, payload.data(), state, scales.data());
    });
    const double dec = best_seconds(reps, [&] { codec->decode(payload.data(), n, out.data(), state, scales.data()); });
    const double ratio =
        static_cast<double>(n * sizeof(float)) / static_cast<double>(std::max<std::size_t>(1, payload.size()));
    fmt::print("{:<38} {:>12} {:>8.1f} {:>12.2f} {:>12.2f} {:>14.2f}\n", codec->name(), hc::to_string(codec->pattern()),
               ratio, gb / enc, gb / dec, gb / memcpy_s);
  }
  return 0;
}
