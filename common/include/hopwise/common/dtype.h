// Element types and reduction operations that every layer shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "hopwise/common/half.h"

namespace hopwise {

enum class DataType : std::uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };
enum class ReduceOp : std::uint8_t { kSum, kAvg, kMin, kMax, kProd };

inline constexpr DataType kAllDataTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                             DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                                             DataType::kUInt8};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                             ReduceOp::kProd};

std::size_t dtype_size(DataType dt);
bool is_floating(DataType dt);
std::string_view to_string(DataType dt);
std::string_view to_string(ReduceOp op);

// Parse "float32"/"f32"/"float", "float16"/"half", "bfloat16"/"bf16", ...; throws InvalidArgument listing choices.
DataType parse_dtype(std::string_view name);
ReduceOp parse_reduce_op(std::string_view name);

// Throws InvalidArgument when `op` makes no sense for `dt` (averaging integers would silently truncate).
void check_op_supported(DataType dt, ReduceOp op);

// count * dtype_size with an overflow check; `what` names the call in the error.
std::size_t checked_bytes(std::size_t count, DataType dt, std::string_view what);

// The DataType of a C++ element type.
template <class T>
constexpr DataType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DataType::kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return DataType::kFloat64;
  else if constexpr (std::is_same_v<T, float16>)
    return DataType::kFloat16;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return DataType::kBFloat16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DataType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DataType::kInt64;
  else {
    static_assert(std::is_same_v<T, std::uint8_t>, "unsupported element type");
    return DataType::kUInt8;
  }
}

}  // namespace hopwise
