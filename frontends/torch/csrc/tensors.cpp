#include "tensors.h"

#include <fmt/core.h>

#include <c10/util/Exception.h>

#include "hopwise/common/error.h"

namespace hopwise::torch_backend {

std::string op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return fmt::format("op {}", static_cast<int>(op));
  }
}

namespace {

std::optional<DataType> carried(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kByte: return DataType::kUInt8;
    default: return std::nullopt;
  }
}

std::optional<ReduceOp> arithmetic(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    default: return std::nullopt;
  }
}

}  // namespace

ReducePlan plan_reduce(at::ScalarType dtype, const c10d::ReduceOp& reduce_op, const char* what) {
  const auto op = reduce_op.op_;
  ReducePlan plan;
  plan.torch_op = op;
  const bool bitwise = op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR;
  const bool integral = at::isIntegralType(dtype, /*includeBool=*/true);
  if (bitwise) {
    TORCH_CHECK_VALUE(integral, "hopwise: ", what, " with ", op_name(op), " needs an integer or bool tensor, not ",
                      c10::toString(dtype));
    plan.way = ReducePlan::Way::kGatherFold;
    return plan;
  }
  TORCH_CHECK_VALUE(arithmetic(op).has_value(), "hopwise: ", what, ": reduce op ", op_name(op),
                    " is not supported; use SUM, AVG, PRODUCT, MIN, MAX (or BAND/BOR/BXOR on integers)");
  plan.op = *arithmetic(op);
  TORCH_CHECK_VALUE(!(plan.op == ReduceOp::kAvg && integral), "hopwise: ", what, ": AVG of ", c10::toString(dtype),
                    " would truncate; use SUM and divide, or a floating-point tensor");
  if (dtype == at::kBool) {
    // Booleans reduce as logical ops: sum and max are "any", product and min are "all".
    plan.wide = at::kByte;
    plan.dtype = DataType::kUInt8;
    plan.op = plan.op == ReduceOp::kSum || plan.op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kMin;
    return plan;
  }
  if (dtype == at::kChar || dtype == at::kShort) {
    // Widened to int32 and narrowed back: the same result, modulo 2^8 or 2^16, as arithmetic in the narrow type.
    plan.wide = at::kInt;
    plan.dtype = DataType::kInt32;
    return plan;
  }
  auto dt = carried(dtype);
  TORCH_CHECK_VALUE(dt.has_value(), "hopwise: ", what, ": dtype ", c10::toString(dtype),
                    " is not supported; use float32/64, float16, bfloat16, int8/16/32/64, uint8 or bool");
  plan.dtype = *dt;
  return plan;
}

void Staged::finish() const {
  if (buf.is_same(user)) return;
  if (user.is_complex() && !buf.is_complex()) {  // reduced as pairs of reals
    if (buf.data_ptr() != user.data_ptr()) user.copy_(at::view_as_complex(buf));
    return;
  }
  user.copy_(buf);
}

Staged stage(const at::Tensor& t, at::ScalarType wide, bool copy_in) {
  Staged s{t, t};
  const bool widen = wide != at::ScalarType::Undefined && wide != t.scalar_type();
  if (!widen && t.is_contiguous()) return s;
  const auto dtype = widen ? wide : t.scalar_type();
  s.buf = copy_in ? t.to(dtype, /*non_blocking=*/false, /*copy=*/true).contiguous()
                  : at::empty(t.sizes(), t.options().dtype(dtype));
  return s;
}

void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), "hopwise: ", what, ": the tensor is undefined");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "hopwise: ", what, ": the tensor is on ", t.device().str(),
                    "; hopwise carries CPU tensors in every collective and CUDA ones in allreduce, broadcast, "
                    "allgather, all_gather_into_tensor and reduce_scatter_tensor (where built with CUDA): use "
                    "backend \"nccl\" for this one");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "hopwise: ", what, ": sparse tensors are not supported");
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK_VALUE(ts.size() == 1, "hopwise: ", what, " takes one tensor per rank (one CPU device), got ", ts.size());
  check_tensor(ts[0], what);
  return ts[0];
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  check_tensor(b, what);
  TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type(), "hopwise: ", what, ": tensors of ",
                    c10::toString(a.scalar_type()), " and ", c10::toString(b.scalar_type()), " mixed; use one dtype");
  TORCH_CHECK_VALUE(a.numel() == b.numel(), "hopwise: ", what, ": tensors of ", a.numel(), " and ", b.numel(),
                    " elements where the sizes must match");
}

void fold_bitwise(const at::Tensor& gathered, c10d::ReduceOp::RedOpType op, at::Tensor& out) {
  at::Tensor acc = gathered[0].clone();
  for (int64_t r = 1; r < gathered.size(0); ++r) {
    if (op == c10d::ReduceOp::BAND)
      acc.bitwise_and_(gathered[r]);
    else if (op == c10d::ReduceOp::BOR)
      acc.bitwise_or_(gathered[r]);
    else
      acc.bitwise_xor_(gathered[r]);
  }
  out.copy_(acc.view(out.sizes()));
}

}  // namespace hopwise::torch_backend
