// PowerSGD on device memory (see device_powersgd.h): the products in cuBLAS, Gram-Schmidt in a kernel.
//
// cuBLAS is column-major: a row-major R x C matrix with leading dimension C is, to cuBLAS, the column-major
// C x R matrix (its transpose) with the same leading dimension. Below, X' names that view of row-major X:
//   M' cols x rows (ld cols), Q' cols x r (ld cols), P' and P^' r x rows (ld r).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "codec_kernels.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/device_powersgd.h"

namespace hopwise::compression {

namespace {

using hopwise::cuda::check;  // CUDA runtime calls; cuBLAS's below

void check(cublasStatus_t e, const char* what) {
  if (e != CUBLAS_STATUS_SUCCESS)
    throw TransportError(std::string("powersgd (cuda): ") + what + " failed: " + cublasGetStatusString(e) +
                         " (cuBLAS; check that the GPU has free memory and the buffers are device memory)");
}

std::string shape(std::size_t rows, std::size_t cols) { return std::to_string(rows) + " x " + std::to_string(cols); }

// One cuBLAS handle per (thread, device): a handle belongs to the device current at its creation and must not be
// used from two threads at once; creating one costs milliseconds, so they are kept until the thread ends.
cublasHandle_t blas(cudaStream_t stream) {
  struct Cache {
    std::vector<std::pair<int, cublasHandle_t>> handles;
    ~Cache() {
      for (auto& h : handles) cublasDestroy(h.second);  // at thread exit; nothing left to report to
    }
  };
  thread_local Cache cache;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cublasHandle_t handle = nullptr;
  for (auto& h : cache.handles)
    if (h.first == device) handle = h.second;
  if (handle == nullptr) {
    check(cublasCreate(&handle), "cublasCreate");
    cache.handles.emplace_back(device, handle);
    // Float32 products in float32 arithmetic: no TF32 tensor cores (they would round the inputs to 10 bits).
    check(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  check(cublasSetStream(handle, stream), "cublasSetStream");
  return handle;
}

// C = alpha op(A) op(B) + beta C, column-major, float32.
void gemm(cudaStream_t s, cublasOperation_t ta, cublasOperation_t tb, std::size_t m, std::size_t n, std::size_t k,
          float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
          std::size_t ldc, const char* what) {
  check(cublasSgemm(blas(s), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a,
                    static_cast<int>(lda), b, static_cast<int>(ldb), &beta, c, static_cast<int>(ldc)),
        what);
}

constexpr unsigned kGsThreads = 1024;
constexpr unsigned kGsWarps = kGsThreads / 32;

__device__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block, the same on every thread. A fixed tree (no atomics): the same inputs give the same bits, so
// every rank orthonormalizes the summed P alike.
__device__ double block_sum(double v, double* sh) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double t = lane < kGsWarps ? sh[lane] : 0.0;
    t = warp_sum(t);
    if (lane == 0) sh[kGsWarps] = t;
  }
  __syncthreads();
  const double total = sh[kGsWarps];
  __syncthreads();  // all have read it before the next call writes sh again
  return total;
}

// Modified Gram-Schmidt on the r columns of p (rows x r, row-major), in double, in one block, as the CPU does:
// basis (column-major, rows x r doubles) gets the orthonormal columns, p_hat (rows x r floats) their float copy.
// A column whose norm after the projections is not > 1e-30 (or not finite) becomes 0 in both. Thread t touches
// only the rows i with i % blockDim.x == t, so only the sums need a barrier.
__global__ void __launch_bounds__(kGsThreads)
    gram_schmidt_kernel(const float* p, std::size_t rows, std::size_t r, float* p_hat, double* basis) {
  __shared__ double sh[kGsWarps + 1];
  for (std::size_t j = 0; j < r; ++j) {
    double* col = basis + j * rows;
    for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) col[i] = p[i * r + j];
    for (std::size_t k = 0; k < j; ++k) {
      const double* e = basis + k * rows;
      double d = 0;
      for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) d += col[i] * e[i];
      d = block_sum(d, sh);
      for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) col[i] -= d * e[i];
    }
    double norm = 0;
    for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) norm += col[i] * col[i];
    norm = sqrt(block_sum(norm, sh));
    const bool keep = norm > 1e-30 && isfinite(norm);  // the CPU's test: a vanished (or broken) column stays 0
    for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) {
      col[i] = keep ? col[i] / norm : 0.0;
      p_hat[i * r + j] = static_cast<float>(col[i]);
    }
  }
}

void expect_phase(const DevicePowerSgdState& state, int phase, std::size_t rows, std::size_t cols, const char* what) {
  if (state.phase != phase || state.rows != rows || state.cols != cols)
    throw InvalidArgument(std::string("powersgd: ") + what + " on the same state and shape");
}

// cuBLAS takes int dimensions.
void expect_int_shape(std::size_t rows, std::size_t cols) {
  if (rows > static_cast<std::size_t>(INT_MAX) || cols > static_cast<std::size_t>(INT_MAX))
    throw InvalidArgument("powersgd (cuda): a " + shape(rows, cols) +
                          " matrix has a dimension over 2^31 - 1, more than cuBLAS takes; reshape or split it");
}

}  // namespace

DevicePowerSgd::DevicePowerSgd(const PowerSgd& config) : host_(config), ef_(config.error_feedback()) {}

void DevicePowerSgd::compute_p(const float* grad, std::size_t rows, std::size_t cols, float* p,
                               DevicePowerSgdState& state, void* stream) const {
  const std::size_t n = rows * cols, r = host_.effective_rank(rows, cols);
  const auto s = static_cast<cudaStream_t>(stream);
  if (state.phase != 0)
    throw InvalidArgument(
        "powersgd: compute_p called before the previous step's decompress; call compute_p, "
        "compute_q, decompress in turn");
  if (n > 0 && (grad == nullptr || p == nullptr))
    throw InvalidArgument("powersgd: null buffer for a " + shape(rows, cols) + " matrix");
  expect_int_shape(rows, cols);
  if (state.q_count == 0 && state.rows == 0 && state.cols == 0) {
    // The initial Q is drawn by the CPU code itself: compute_p on an r x cols zero matrix draws the same r x cols
    // normal values from the seed as on rows x cols (the draw depends on the seed and r * cols only).
    PowerSgdState draw(state.seed);
    const PowerSgd drawer(host_.rank(), false);
    const std::vector<float> zeros(r * cols, 0.0f);
    std::vector<float> p_draw(r * r);
    drawer.compute_p(zeros.data(), r, cols, p_draw.data(), draw);
    state.q.reserve(r * cols * sizeof(float));
    state.p_hat.reserve(rows * r * sizeof(float));
    state.basis.reserve(rows * r * sizeof(double));
    if (ef_) {
      state.m.reserve(n * sizeof(float));
      state.q_local.reserve(r * cols * sizeof(float));
    }
    if (n > 0) {
      check(cudaMemcpyAsync(state.q.data(), draw.q.data(), draw.q.size() * sizeof(float), cudaMemcpyHostToDevice, s),
            "copying the initial Q to the device");
      if (ef_) check(cudaMemsetAsync(state.m.data(), 0, n * sizeof(float), s), "zeroing M");  // no residual yet
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize after the initial Q upload");    // draw.q is freed next
    }
    state.rows = rows;
    state.cols = cols;
    state.q_count = draw.q.size();
    state.q_local_count = 0;
  } else if (state.rows != rows || state.cols != cols) {
    throw InvalidArgument("powersgd: the state belongs to a " + shape(state.rows, state.cols) + " matrix, not " +
                          shape(rows, cols) + "; keep one DevicePowerSgdState per tensor");
  }
  state.grad = grad;
  if (n > 0) {
    const float* m = grad;
    if (ef_) {
      float* mm = state.m.as<float>();
      if (state.q_local_count > 0)  // M' -= Q_local' P^' : M minus P^ q_local, the residual of the last step
        gemm(s, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, r, -1.0f, state.q_local.as<float>(), cols,
             state.p_hat.as<float>(), r, 1.0f, mm, cols, "cublasSgemm (residual)");
      cuda::kernels::add_into(mm, grad, n, s);  // m += g, in the CPU's order
      m = mm;
    }
    // P' (r x rows) = Q'^T M' : P = M Q^T.
    gemm(s, CUBLAS_OP_T, CUBLAS_OP_N, r, rows, cols, 1.0f, state.q.as<float>(), cols, m, cols, 0.0f, p, r,
         "cublasSgemm (P = M Q)");
  }
  state.phase = 1;
}

void DevicePowerSgd::compute_q(const float* p_sum, std::size_t rows, std::size_t cols, float* q,
                               DevicePowerSgdState& state, void* stream) const {
  const std::size_t r = host_.effective_rank(rows, cols);
  const auto s = static_cast<cudaStream_t>(stream);
  expect_phase(state, 1, rows, cols, "compute_q must follow compute_p");
  if (rows * cols > 0) {
    if (p_sum == nullptr || q == nullptr)
      throw InvalidArgument("powersgd: null buffer for a " + shape(rows, cols) + " matrix");
    gram_schmidt_kernel<<<1, kGsThreads, 0, s>>>(p_sum, rows, r, state.p_hat.as<float>(), state.basis.as<double>());
    check(cudaGetLastError(), "Gram-Schmidt kernel launch");
    // Q' (cols x r) = M' P^'^T : Q = P^^T M.
    const float* m = ef_ ? state.m.as<float>() : state.grad;
    gemm(s, CUBLAS_OP_N, CUBLAS_OP_T, cols, r, rows, 1.0f, m, cols, state.p_hat.as<float>(), r, 0.0f, q, cols,
         "cublasSgemm (Q = P^T M)");
    if (ef_)
      check(cudaMemcpyAsync(state.q_local.data(), q, r * cols * sizeof(float), cudaMemcpyDeviceToDevice, s),
            "keeping this rank's Q");
  }
  if (ef_) state.q_local_count = r * cols;
  state.grad = nullptr;
  state.phase = 2;
}

void DevicePowerSgd::decompress(const float* q_sum, std::size_t rows, std::size_t cols, float* out,
                                DevicePowerSgdState& state, void* stream) const {
  const std::size_t r = host_.effective_rank(rows, cols);
  const auto s = static_cast<cudaStream_t>(stream);
  expect_phase(state, 2, rows, cols, "decompress must follow compute_q");
  if (rows * cols > 0) {
    if (q_sum == nullptr || out == nullptr)
      throw InvalidArgument("powersgd: null buffer for a " + shape(rows, cols) + " matrix");
    // out' (cols x rows) = Q_sum' P^' : out = P^ Q_sum^T.
    gemm(s, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, r, 1.0f, q_sum, cols, state.p_hat.as<float>(), r, 0.0f, out, cols,
         "cublasSgemm (out = P^ Q^T)");
    check(cudaMemcpyAsync(state.q.data(), q_sum, r * cols * sizeof(float), cudaMemcpyDeviceToDevice, s),
          "keeping the summed Q as the warm start");
  }
  state.q_count = r * cols;
  ++state.step;
  state.phase = 0;
}

std::vector<float> DevicePowerSgd::residual(const DevicePowerSgdState& state, void* stream) const {
  if (!ef_ || state.q_local_count == 0) return {};
  const std::size_t rows = state.rows, cols = state.cols, n = rows * cols, r = state.q_local_count / cols;
  const auto s = static_cast<cudaStream_t>(stream);
  DeviceBuffer res(n * sizeof(float));
  check(cudaMemcpyAsync(res.data(), state.m.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, s), "copying M");
  gemm(s, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, r, -1.0f, state.q_local.as<float>(), cols, state.p_hat.as<float>(), r,
       1.0f, res.as<float>(), cols, "cublasSgemm (residual)");
  std::vector<float> host(n);
  check(cudaMemcpyAsync(host.data(), res.data(), n * sizeof(float), cudaMemcpyDeviceToHost, s), "copying the residual");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize after the residual copy");
  return host;
}

}  // namespace hopwise::compression
