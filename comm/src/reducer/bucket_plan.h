// Bucket planning, shared by the host GradientReducer (host_reducer.cpp) and the DeviceGradientReducer
// (device_reducer.cpp): which gradients go into which bucket, the layout fingerprint every rank compares, and the
// rebuild from the order backward really produced the gradients in. Arithmetic only: each reducer moves the
// fingerprints and the order over its own communicator and lays its buckets out in its own memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/comm/reducer.h"  // ReducerOptions

namespace hopwise::comm::bucket_plan {

// A registered gradient as planning sees it.
struct Gradient {
  std::string_view name;
  std::size_t count = 0;
  std::size_t rows = 1;  // the matrix shape PowerSGD compresses (1: a vector)
};

// One planned bucket: its gradients in the order they sit in it, and its element count.
struct Planned {
  std::vector<int> members;
  std::size_t count = 0;
};

// Reverse registration order of n gradients: the order backward normally produces them in.
std::vector<int> reverse_order(std::size_t n);

// Buckets in `order` (its first gradient goes first): the first capped at first_bucket_mb, so that communication
// starts early, the rest at bucket_mb; a gradient over the cap gets a bucket of its own.
std::vector<Planned> assign(std::span<const Gradient> gradients, std::span<const int> order,
                            const ReducerOptions& options);

// One 64-bit fingerprint of the layout: every gradient's name, count and rows, the compression spec and the
// bucket sizes.
std::uint64_t fingerprint(std::span<const Gradient> gradients, std::string_view compression,
                          std::span<const Planned> buckets);

// InvalidArgument naming the ranks whose fingerprint (`all`, in rank order) differs from rank 0's. `kind` names
// the reducer in the message ("gradient", "device gradient").
void check_same_layout(std::span<const std::uint64_t> all, int rank, std::string_view kind);

// The order to rebuild the buckets in after the first step: `observed` (rank 0's mark_ready order) where it
// differs from reverse_order, else nothing (the buckets already follow it).
std::optional<std::vector<int>> rebuild_order(std::span<const int> observed, std::size_t n);

// Every bucket's gradient names in bucket order (bucket_names() of either reducer): buckets with the gradient
// indices `params`, gradients with a `name`.
template <class Buckets, class Gradients>
std::vector<std::vector<std::string>> names_of(const Buckets& buckets, const Gradients& gradients) {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets) {
    out.emplace_back();
    for (int i : b.params) out.back().push_back(gradients[static_cast<std::size_t>(i)].name);
  }
  return out;
}

}  // namespace hopwise::comm::bucket_plan
