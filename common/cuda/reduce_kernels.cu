// CUDA reduction kernels: one grid-stride kernel per (dtype, op), half types widened to float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "hopwise/common/cuda_check.h"
#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/error.h"

namespace hopwise::cuda {

namespace {

template <class T>
struct Arith {
  using type = T;
};
template <>
struct Arith<std::int32_t> {
  using type = std::uint32_t;
};
template <>
struct Arith<std::int64_t> {
  using type = std::uint64_t;
};

template <class T>
__device__ float widen(T x) {
  return static_cast<float>(x);
}
template <>
__device__ float widen(__half x) {
  return __half2float(x);
}
template <>
__device__ float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T, class C>
__device__ C combine(ReduceOp op, C x, C y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return x + y;
    case ReduceOp::kProd: return x * y;
    case ReduceOp::kMin: return y < x ? y : x;
    case ReduceOp::kMax: return x < y ? y : x;
  }
  return x;
}

template <class T>
__global__ void reduce_kernel(ReduceOp op, T* d, const T* a, const T* b, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, __half>) {
      d[i] = __float2half_rn(combine<T, float>(op, widen(a[i]), widen(b[i])));
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      d[i] = __float2bfloat16_rn(combine<T, float>(op, widen(a[i]), widen(b[i])));
    } else {
      using A = typename Arith<T>::type;
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kProd)
        d[i] = static_cast<T>(combine<T, A>(op, static_cast<A>(a[i]), static_cast<A>(b[i])));
      else
        d[i] = combine<T, T>(op, a[i], b[i]);
    }
  }
}

template <class T>
__global__ void scale_kernel(T* x, double factor, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, double>)
      x[i] *= factor;
    else if constexpr (std::is_same_v<T, float>)
      x[i] *= static_cast<float>(factor);
    else if constexpr (std::is_same_v<T, __half>)
      x[i] = __float2half_rn(__half2float(x[i]) * static_cast<float>(factor));
    else
      x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * static_cast<float>(factor));
  }
}

template <class T>
void launch_scale(void* x, double factor, std::size_t n, cudaStream_t s) {
  const unsigned threads = 256;
  const std::size_t want = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 ? want : 65535);
  scale_kernel<T><<<blocks, threads, 0, s>>>(static_cast<T*>(x), factor, n);
  check(cudaGetLastError(), "scale kernel launch");
}

template <class T>
void launch(ReduceOp op, void* d, const void* a, const void* b, std::size_t n, cudaStream_t s) {
  const unsigned threads = 256;
  const std::size_t want = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 ? want : 65535);
  reduce_kernel<T>
      <<<blocks, threads, 0, s>>>(op, static_cast<T*>(d), static_cast<const T*>(a), static_cast<const T*>(b), n);
  check(cudaGetLastError(), "reduce kernel launch");
}

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

void reduce_into(DataType dt, ReduceOp op, void* d, const void* a, const void* b, std::size_t n, void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  switch (dt) {
    case DataType::kFloat32: return launch<float>(op, d, a, b, n, s);
    case DataType::kFloat64: return launch<double>(op, d, a, b, n, s);
    case DataType::kFloat16: return launch<__half>(op, d, a, b, n, s);
    case DataType::kBFloat16: return launch<__nv_bfloat16>(op, d, a, b, n, s);
    case DataType::kInt32: return launch<std::int32_t>(op, d, a, b, n, s);
    case DataType::kInt64: return launch<std::int64_t>(op, d, a, b, n, s);
    case DataType::kUInt8: return launch<std::uint8_t>(op, d, a, b, n, s);
  }
}

void scale(DataType dt, void* x, double factor, std::size_t n, void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  switch (dt) {
    case DataType::kFloat32: return launch_scale<float>(x, factor, n, s);
    case DataType::kFloat64: return launch_scale<double>(x, factor, n, s);
    case DataType::kFloat16: return launch_scale<__half>(x, factor, n, s);
    case DataType::kBFloat16: return launch_scale<__nv_bfloat16>(x, factor, n, s);
    default:
      throw InvalidArgument("cuda::scale: " + std::string(to_string(dt)) +
                            " is not a floating type; averaging "
                            "integers is not supported");
  }
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return p;
}
void device_free(void* p) { cudaFree(p); }

}  // namespace hopwise::cuda
