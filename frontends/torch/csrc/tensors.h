// Torch tensors as hopwise buffers: which dtypes hopwise carries, how torch's reduce ops map onto hopwise's, and
// staging (a contiguous copy, or a wider dtype for int8/int16/bool) with the copy back once the call is done.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <string>
#include <vector>

#include "hopwise/common/dtype.h"

namespace hopwise::torch_backend {

// How a reduction of `dtype` with `op` runs: natively in hopwise (`native`), widened to `wide` first (int8,
// int16 and bool, which hopwise does not carry), or by gathering every rank's tensor and folding it here
// (bitwise ops, which hopwise has no kernels for). Throws c10::ValueError naming what is not supported.
struct ReducePlan {
  enum class Way { kNative, kGatherFold } way = Way::kNative;
  DataType dtype = DataType::kFloat32;              // what hopwise reduces
  at::ScalarType wide = at::ScalarType::Undefined;  // the staging dtype, when not the tensor's own
  ReduceOp op = ReduceOp::kSum;
  c10d::ReduceOp::RedOpType torch_op = c10d::ReduceOp::SUM;
};
ReducePlan plan_reduce(at::ScalarType dtype, const c10d::ReduceOp& op, const char* what);

// A tensor as a buffer hopwise reads and writes: `buf` is contiguous and in the staging dtype; `user` is the
// caller's tensor, written back by finish() when `buf` is a copy.
struct Staged {
  at::Tensor user, buf;
  void* data() const { return buf.data_ptr(); }
  std::size_t count() const { return static_cast<std::size_t>(buf.numel()); }
  std::size_t bytes() const { return static_cast<std::size_t>(buf.numel()) * buf.element_size(); }
  void finish() const;
};
// `wide`: Undefined keeps the tensor's dtype. `copy_in`: whether the copy needs the tensor's values (not for
// outputs only).
Staged stage(const at::Tensor& t, at::ScalarType wide = at::ScalarType::Undefined, bool copy_in = true);

// The common checks: a CPU tensor (dense, strided), one tensor per list (one device per rank).
void check_tensor(const at::Tensor& t, const char* what);
const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* what);
void check_same(const at::Tensor& a, const at::Tensor& b, const char* what);

// Folds gathered tensors (p x n, the rank's tensor in row r) with a bitwise op into `out`.
void fold_bitwise(const at::Tensor& gathered, c10d::ReduceOp::RedOpType op, at::Tensor& out);

std::string op_name(c10d::ReduceOp::RedOpType op);

// One tensor as the list a Work reports its outputs in.
inline std::vector<at::Tensor> as_list(const at::Tensor& t) { return {t}; }

}  // namespace hopwise::torch_backend
