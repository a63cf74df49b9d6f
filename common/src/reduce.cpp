// Picks the widest kernel set the CPU supports, once; HOPWISE_ISA caps it.
#include "hopwise/common/reduce.h"

#include <cstring>

#include "hopwise/common/env.h"
#include "hopwise/common/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace hopwise {
namespace kernels {
#define HOPWISE_DECLARE_ISA(ns)                                                                \
  namespace ns {                                                                               \
  void reduce(DataType dt, ReduceOp op, void* d, const void* a, const void* b, std::size_t n); \
  void scale(DataType dt, void* p, std::size_t n, double factor);                              \
  }
HOPWISE_DECLARE_ISA(generic)
#if defined(__x86_64__)
HOPWISE_DECLARE_ISA(avx2)
HOPWISE_DECLARE_ISA(avx512)
#endif
}  // namespace kernels

namespace {

#if defined(__x86_64__)
// F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know "f16c" as a __builtin_cpu_supports feature.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

struct KernelSet {
  std::string_view name;
  void (*reduce)(DataType, ReduceOp, void*, const void*, const void*, std::size_t);
  void (*scale)(DataType, void*, std::size_t, double);
};

KernelSet pick() {
  const std::string cap = env::get_or("HOPWISE_ISA", "avx512");
  if (cap != "generic" && cap != "avx2" && cap != "avx512")
    throw InvalidArgument("HOPWISE_ISA='" + cap + "' is unknown; use generic, avx2 or avx512");
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (cap == "avx512" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return {"avx512", kernels::avx512::reduce, kernels::avx512::scale};
  if (cap != "generic" && __builtin_cpu_supports("avx2") && cpu_has_f16c() && __builtin_cpu_supports("fma"))
    return {"avx2", kernels::avx2::reduce, kernels::avx2::scale};
#endif
  return {"generic", kernels::generic::reduce, kernels::generic::scale};
}

thread_local WorkHook work_hook = nullptr;

const KernelSet& active() {
  static const KernelSet set = pick();
  return set;
}

}  // namespace

void reduce_into(DataType dt, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  if (n == 0 || (work_hook && work_hook(ElementWork::kReduce, n * dtype_size(dt)))) return;
  active().reduce(dt, op, dst, a, b, n);
}

void scale_by(DataType dt, void* buf, std::size_t n, double factor) {
  if (n == 0 || (work_hook && work_hook(ElementWork::kScale, n * dtype_size(dt)))) return;
  active().scale(dt, buf, n, factor);
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src || (work_hook && work_hook(ElementWork::kCopy, bytes))) return;
  std::memmove(dst, src, bytes);
}

void set_work_hook(WorkHook hook) { work_hook = hook; }

std::string_view active_isa() { return active().name; }

}  // namespace hopwise
