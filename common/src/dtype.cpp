#include "hopwise/common/dtype.h"

#include <fmt/core.h>

#include <limits>

#include "hopwise/common/error.h"

namespace hopwise {

std::size_t dtype_size(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
  }
  throw InvalidArgument(
      fmt::format("unknown dtype code {}; use one of float32, float64, float16, bfloat16, "
                  "int32, int64, uint8",
                  static_cast<int>(dt)));
}

bool is_floating(DataType dt) {
  return dt == DataType::kFloat32 || dt == DataType::kFloat64 || dt == DataType::kFloat16 || dt == DataType::kBFloat16;
}

std::string_view to_string(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
  }
  return "unknown-dtype";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "unknown-op";
}

DataType parse_dtype(std::string_view n) {
  if (n == "float32" || n == "float" || n == "f32" || n == "fp32") return DataType::kFloat32;
  if (n == "float64" || n == "double" || n == "f64" || n == "fp64") return DataType::kFloat64;
  if (n == "float16" || n == "half" || n == "f16" || n == "fp16") return DataType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DataType::kBFloat16;
  if (n == "int32" || n == "int" || n == "i32") return DataType::kInt32;
  if (n == "int64" || n == "i64") return DataType::kInt64;
  if (n == "uint8" || n == "u8" || n == "byte") return DataType::kUInt8;
  throw InvalidArgument(
      fmt::format("unknown dtype '{}'; use one of float32, float64, float16, bfloat16, int32, "
                  "int64, uint8",
                  n));
}

ReduceOp parse_reduce_op(std::string_view n) {
  if (n == "sum") return ReduceOp::kSum;
  if (n == "avg" || n == "mean") return ReduceOp::kAvg;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "prod") return ReduceOp::kProd;
  throw InvalidArgument(fmt::format("unknown reduce op '{}'; use one of sum, avg, min, max, prod", n));
}

void check_op_supported(DataType dt, ReduceOp op) {
  dtype_size(dt);  // rejects unknown codes
  if (static_cast<int>(op) > static_cast<int>(ReduceOp::kProd))
    throw InvalidArgument(
        fmt::format("unknown reduce op code {}; use sum, avg, min, max or prod", static_cast<int>(op)));
  if (op == ReduceOp::kAvg && !is_floating(dt))
    throw InvalidArgument(
        fmt::format("op avg on {} would truncate; use sum and divide, or a floating dtype", to_string(dt)));
}

std::size_t checked_bytes(std::size_t count, DataType dt, std::string_view what) {
  const std::size_t es = dtype_size(dt);
  if (count > std::numeric_limits<std::size_t>::max() / es / 4)
    throw InvalidArgument(
        fmt::format("{}: count {} of {} overflows the byte size; pass a smaller count", what, count, to_string(dt)));
  return count * es;
}

}  // namespace hopwise
