// The averaging methods' table (averaging_method.h), the one dispatch on a gradient scope, and what every method's
// context offers.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/training/averaging_method.h"

namespace hopwise::comm {

namespace detail {
// Each defined by its method's file.
AveragingMethodRow sync_row();
AveragingMethodRow local_row();
AveragingMethodRow hier_row();
AveragingMethodRow gossip_row();
AveragingMethodRow async_row();
AveragingMethodRow diloco_row();
}  // namespace detail

namespace {

struct Table {
  std::mutex mutex;
  std::vector<std::shared_ptr<const AveragingMethodRow>> rows;
};

void check(const AveragingMethodRow& row) {
  if (row.name.empty() || !row.make)
    throw InvalidArgument("register_averaging_method: a row needs a name and a factory");
  const auto known = averaging_spec_fields();
  for (const auto& list : {row.fields, row.required, row.shown})
    for (const auto& f : list)
      if (std::find(known.begin(), known.end(), f) == known.end())
        throw InvalidArgument(fmt::format("register_averaging_method({}): '{}' is not a field of AveragingSpec ({})",
                                          row.name, f, fmt::join(known, ", ")));
}

Table& table() {
  static Table* t = [] {
    auto* init = new Table;  // never destroyed: rows may be looked up during exit
    for (auto make : {detail::sync_row, detail::local_row, detail::hier_row, detail::gossip_row, detail::async_row,
                      detail::diloco_row})
      init->rows.push_back(std::make_shared<const AveragingMethodRow>(make()));
    return init;
  }();
  return *t;
}

}  // namespace

void register_averaging_method(AveragingMethodRow row) {
  check(row);
  Table& t = table();
  std::lock_guard lock(t.mutex);
  std::erase_if(t.rows, [&](const auto& r) { return r->name == row.name; });
  t.rows.push_back(std::make_shared<const AveragingMethodRow>(std::move(row)));
}

std::shared_ptr<const AveragingMethodRow> find_averaging_method(const std::string& name) {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  for (const auto& r : t.rows)
    if (r->name == name) return r;
  return nullptr;
}

bool averaging_regroups(const AveragingSpec& spec) {
  const auto row = find_averaging_method(spec.method);
  return row && row->regroups && row->regroups(spec);
}

std::vector<std::string> averaging_method_names() {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  std::vector<std::string> names;
  for (const auto& r : t.rows) names.push_back(r->name);
  return names;
}

void AveragingContext::average_world() {
  fetch_all();
  comm->allreduce(params, params, count, DataType::kFloat32, ReduceOp::kAvg);
  publish_all();
  ++stats.averages;
  stats.bytes += count * sizeof(float);
}

std::optional<Work> average_in_scope_async(Communicator& comm, GradientScope scope, float* data, std::size_t n) {
  switch (scope) {
    case GradientScope::kWorld: return comm.allreduce_async(data, data, n, DataType::kFloat32, ReduceOp::kAvg);
    case GradientScope::kHost:
      return comm.allreduce_within_host_async(data, data, n, DataType::kFloat32, ReduceOp::kAvg);
    case GradientScope::kNone: break;
  }
  return std::nullopt;
}

}  // namespace hopwise::comm
