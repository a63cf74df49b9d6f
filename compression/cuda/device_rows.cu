// The device rows (device_rows.h): each codec's CUDA encode and decode, and the parameters it reads, one row per
// codec; what was a switch over the codecs in device_codec.cu.
#include "device_rows.h"

#include <string>

#include "hopwise/common/error.h"

namespace hopwise::compression::device {

namespace {

namespace k = cuda::kernels;
using k::Out;

// Scratch layout in DeviceCodecState::scratch: header partial sums, topk's bad-index count, topk's workspace.
constexpr std::size_t kPartialsBytes = k::kReducePartials * sizeof(double);
constexpr std::size_t kBadOffset = kPartialsBytes;
constexpr std::size_t kTopkOffset = kPartialsBytes + 16;

std::byte* scratch(DeviceCodecState& st, std::size_t n) {
  st.scratch.reserve(kTopkOffset + k::topk_workspace_bytes(n));
  return st.scratch.as<std::byte>();
}

double* partials(const Call& c) { return reinterpret_cast<double*>(scratch(c.state, c.n)); }

detail::Stream rank_stream(const Call& c) {
  return detail::rank_stream(c.state.host.seed, c.state.host.rank, c.state.host.step - 1, c.salt);
}

void no_params(const detail::ParamValues&, Params&) {}

// ---- none: the floats themselves
void copy_encode(const Call& c, const float* x, std::byte* p) {
  if (c.n) k::check(cudaMemcpyAsync(p, x, c.n * sizeof(float), cudaMemcpyDeviceToDevice, c.stream), "cudaMemcpyAsync");
}
void copy_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  k::floats_into(reinterpret_cast<const float*>(p), c.n, out, mode, c.stream);
}

// ---- fp16, bf16
template <bool kBf16>
void half_encode(const Call& c, const float* x, std::byte* p) {
  k::half_encode(kBf16, x, c.n, reinterpret_cast<std::uint16_t*>(p), c.stream);
}
template <bool kBf16>
void half_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  k::half_decode(kBf16, reinterpret_cast<const std::uint16_t*>(p), c.n, out, mode, c.stream);
}

// ---- int8: agreed per-block scales, headroom for the ranks (detail::int8_levels, as the CPU codec)
void int8_configure(const detail::ParamValues& v, Params& p) {
  p.block = static_cast<std::size_t>(v.integer("block"));
  p.stochastic = v.choice("round") == "stochastic";
}
void int8_encode(const Call& c, const float* x, std::byte* p) {
  k::int8_encode(x, c.n, c.params.block, c.scales, detail::int8_levels(c.codec.name(), c.state.host.world_size),
                 c.params.stochastic, rank_stream(c), reinterpret_cast<std::int8_t*>(p), c.stream);
}
void int8_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  k::int8_decode(reinterpret_cast<const std::int8_t*>(p), c.n, c.params.block, c.scales,
                 detail::int8_levels(c.codec.name(), c.state.host.world_size), out, mode, c.stream);
}

// ---- int4, fp8: each rank's own scale at the head of every block of the payload, then the block's codes
void int4_configure(const detail::ParamValues& v, Params& p) {
  p.block = static_cast<std::size_t>(v.integer("block"));
  p.stochastic = v.choice("round") == "stochastic";
}
void int4_encode(const Call& c, const float* x, std::byte* p) {
  k::int4_encode(x, c.n, c.params.block, c.params.stochastic, rank_stream(c), p, c.stream);
}
void int4_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  k::int4_decode(p, c.n, c.params.block, out, mode, c.stream);
}
void fp8_configure(const detail::ParamValues& v, Params& p) { p.block = static_cast<std::size_t>(v.integer("block")); }
void fp8_encode(const Call& c, const float* x, std::byte* p) { k::fp8_encode(x, c.n, c.params.block, p, c.stream); }
void fp8_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  k::fp8_decode(p, c.n, c.params.block, out, mode, c.stream);
}

// ---- qsgd, terngrad, sign: a header statistic, then the elements
void qsgd_configure(const detail::ParamValues& v, Params& p) { p.levels = static_cast<int>(v.integer("levels")); }
void qsgd_encode(const Call& c, const float* x, std::byte* p) {
  k::write_header(k::HeaderStat::kL2Norm, x, c.n, p, partials(c), c.stream);
  k::qsgd_encode(x, c.n, p, c.params.levels, rank_stream(c), c.stream);
}
void qsgd_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  k::qsgd_decode(p, c.n, c.params.levels, out, mode, c.stream);
}
void terngrad_encode(const Call& c, const float* x, std::byte* p) {
  k::write_header(k::HeaderStat::kMaxAbs, x, c.n, p, partials(c), c.stream);
  k::terngrad_encode(x, c.n, p, rank_stream(c), c.stream);
}
void terngrad_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  k::terngrad_decode(p, c.n, out, mode, c.stream);
}
void sign_encode(const Call& c, const float* x, std::byte* p) {
  k::write_header(k::HeaderStat::kMeanAbs, x, c.n, p, partials(c), c.stream);
  k::sign_encode(x, c.n, p, c.stream);
}
void sign_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  k::sign_decode(p, c.n, out, mode, c.stream);
}

// ---- topk: the k largest magnitudes and their uint32 indices
void topk_encode(const Call& c, const float* x, std::byte* p) {
  if (c.n > 0xffffffffull)
    throw InvalidArgument("codec '" + c.codec.name() + "': " + std::to_string(c.n) +
                          " elements do not fit its uint32 indices; split the tensor below 2^32 elements");
  const std::size_t kept = c.codec.payload_count(c.n) / 8;
  k::topk_encode(x, c.n, kept, p, scratch(c.state, c.n) + kTopkOffset, c.stream);
}
void topk_decode(const Call& c, const std::byte* p, float* out, Out mode, bool check_indices) {
  auto* bad = reinterpret_cast<int*>(scratch(c.state, c.n) + kBadOffset);
  k::check(cudaMemsetAsync(bad, 0, sizeof(int), c.stream), "cudaMemsetAsync");
  k::topk_decode(p, c.n, c.codec.payload_count(c.n) / 8, out, mode, bad, c.stream);
  if (!check_indices) return;
  int count = 0;
  k::check(cudaMemcpyAsync(&count, bad, sizeof count, cudaMemcpyDeviceToHost, c.stream), "cudaMemcpyAsync");
  k::check(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
  if (count > 0)
    throw InvalidArgument("codec '" + c.codec.name() + "': " + std::to_string(count) +
                          " payload indices are out of range for " + std::to_string(c.n) +
                          " elements (corrupt payload or a different n than at encode)");
}

// ---- randomk: k values at indices drawn from the seed and the step, the same on every rank
void randomk_encode(const Call& c, const float* x, std::byte* p) {
  k::randomk_encode(x, c.n, c.codec.payload_count(c.n), detail::randomk_key(c.state.host.seed, c.state.host.step - 1),
                    reinterpret_cast<float*>(p), c.stream);
}
void randomk_decode(const Call& c, const std::byte* p, float* out, Out mode, bool) {
  if (c.state.host.step == 0)
    throw InvalidArgument("codec '" + c.codec.name() +
                          "': decode before any encode on this state; the indices come from the step of the latest "
                          "encode");
  k::randomk_decode(reinterpret_cast<const float*>(p), c.n, c.codec.payload_count(c.n),
                    detail::randomk_key(c.state.host.seed, c.state.host.step - 1), out, mode, c.stream);
}

// One row per codec with CUDA kernels.
const Row kRows[] = {
    {"none", no_params, copy_encode, copy_decode},
    {"fp16", no_params, half_encode<false>, half_decode<false>},
    {"bf16", no_params, half_encode<true>, half_decode<true>},
    {"int8", int8_configure, int8_encode, int8_decode},
    {"int4", int4_configure, int4_encode, int4_decode},
    {"fp8", fp8_configure, fp8_encode, fp8_decode},
    {"qsgd", qsgd_configure, qsgd_encode, qsgd_decode},
    {"terngrad", no_params, terngrad_encode, terngrad_decode},
    {"sign", no_params, sign_encode, sign_decode},
    {"topk", no_params, topk_encode, topk_decode},
    {"randomk", no_params, randomk_encode, randomk_decode},
};

}  // namespace

const Row* find_row(std::string_view name) {
  for (const Row& r : kRows)
    if (r.name == name) return &r;
  return nullptr;
}

}  // namespace hopwise::compression::device
