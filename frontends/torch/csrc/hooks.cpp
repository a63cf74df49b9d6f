#include "hooks.h"

#include <fmt/core.h>

#include <cstring>

#include <c10/util/Exception.h>

#include "hopwise/common/error.h"
#include "tensors.h"
#include "translate.h"

namespace hopwise::torch_backend {

namespace {

// Every rank seeds a bucket's state alike (random-k picks the same indices, PowerSGD draws the same first Q).
constexpr std::uint64_t kSeed = 0x686f7077697365ull;  // "hopwise"

// A little binary writer/reader for the checkpointed state: fixed-width fields, vectors with their length.
struct Writer {
  std::string out;
  template <class T>
  void put(const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void put_floats(const std::vector<float>& v) {
    put<std::uint64_t>(v.size());
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  void put_string(const std::string& s) {
    put<std::uint64_t>(s.size());
    out += s;
  }
};
struct Reader {
  const std::string& in;
  std::size_t at = 0;
  void need(std::size_t n) const {
    TORCH_CHECK_VALUE(at + n <= in.size(), "hopwise: the saved hook state is truncated or not a hopwise hook state");
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::vector<float> get_floats() {
    const auto n = get<std::uint64_t>();
    need(n * sizeof(float));
    std::vector<float> v(n);
    std::memcpy(v.data(), in.data() + at, n * sizeof(float));
    at += n * sizeof(float);
    return v;
  }
  std::string get_string() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::string s = in.substr(at, n);
    at += n;
    return s;
  }
};

void check_bucket(const at::Tensor& buffer, const char* what) {
  check_tensor(buffer, what);
  TORCH_CHECK_VALUE(buffer.scalar_type() == at::kFloat && buffer.is_contiguous(), "hopwise: ", what,
                    " compresses contiguous float32 buckets; this one is ", c10::toString(buffer.scalar_type()),
                    " (use hook 'none' or a float32 model)");
}

}  // namespace

CodecHookState::CodecHookState(const std::string& spec, int rank, int size)
    : scope_(translated([&] { return comm::split_compression_scope(spec).first; })),
      codec_(translated([&] { return compression::make_codec(comm::split_compression_scope(spec).second); })),
      rank_(rank),
      size_(size) {}

// The codec runs once over the whole bucket; its error-feedback residual is assembled from the parameters' own
// before the call and handed back to them after it.
c10::intrusive_ptr<c10d::Work> CodecHookState::allreduce(HopwiseBackend& pg, const at::Tensor& buffer,
                                                         const std::vector<at::Tensor>& gradients,
                                                         const std::vector<int64_t>& keys, int64_t bucket) {
  check_bucket(buffer, "compression_hook");
  TORCH_CHECK_VALUE(gradients.size() == keys.size(), "hopwise: compression_hook: ", gradients.size(), " gradients but ",
                    keys.size(), " keys");
  auto& c = pg.communicator();
  TORCH_CHECK_VALUE(c.rank() == rank_ && c.size() == size_, "hopwise: this hook state was made for rank ", rank_,
                    " of ", size_, ", not for this group's rank ", c.rank(), " of ", c.size());
  std::vector<std::size_t> sizes;
  for (const auto& g : gradients) sizes.push_back(static_cast<std::size_t>(g.numel()));
  const std::size_t n = static_cast<std::size_t>(buffer.numel());
  compression::CodecState* state;
  {
    std::lock_guard lock(mutex_);
    auto it = buckets_.find(bucket);
    if (it == buckets_.end())
      it = buckets_.emplace(bucket, compression::CodecState(kSeed + static_cast<std::uint64_t>(bucket), rank_, size_))
               .first;
    state = &it->second;
    if (bucket == 0) ++step_;  // DDP launches its buckets in index order: bucket 0 begins a step
    state->step = step_ > 0 ? step_ - 1 : 0;
    state->residual.clear();
    bool any = false;
    for (auto k : keys) any = any || residuals_.count(k);
    if (any) {
      state->residual.assign(n, 0.0f);
      std::size_t at = 0;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        auto r = residuals_.find(keys[i]);
        if (r != residuals_.end() && r->second.size() == sizes[i])
          std::copy(r->second.begin(), r->second.end(), state->residual.begin() + static_cast<std::ptrdiff_t>(at));
        at += sizes[i];
      }
    }
  }
  auto work = pg.make_work(c10d::OpType::ALLREDUCE, "hopwise:compressed_all_reduce", {buffer});
  auto* data = buffer.data_ptr<float>();
  auto start = [this, &pg, &c, data, n, state, buffer] {
    auto w = translated(
        [&] { return c.allreduce_compressed_async(data, data, n, *codec_, *state, ReduceOp::kAvg, scope_); });
    pg.count_compressed_call(n * sizeof(float));
    return std::vector{w};
  };
  pg.sequencer().launch(work, start, [this, state, keys, sizes](std::exception_ptr e) {
    if (e || state->residual.empty()) return;
    std::lock_guard lock(mutex_);
    std::size_t at = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto from = state->residual.begin() + static_cast<std::ptrdiff_t>(at);
      residuals_[keys[i]].assign(from, from + static_cast<std::ptrdiff_t>(sizes[i]));
      at += sizes[i];
    }
  });
  return work;
}

std::string CodecHookState::save() const {
  std::lock_guard lock(mutex_);
  Writer w;
  w.put_string("hopwise-codec-hook/2");
  w.put_string(spec());
  w.put<std::uint64_t>(step_);
  w.put<std::uint64_t>(residuals_.size());
  for (const auto& [key, r] : residuals_) {
    w.put<std::int64_t>(key);
    w.put_floats(r);
  }
  return w.out;
}

void CodecHookState::load(const std::string& bytes) {
  Reader r{bytes};
  TORCH_CHECK_VALUE(r.get_string() == "hopwise-codec-hook/2", "hopwise: not a saved codec hook state");
  const std::string spec = r.get_string();
  TORCH_CHECK_VALUE(spec == this->spec(), "hopwise: the saved hook state is of codec '", spec, "', this hook's is '",
                    this->spec(), "'");
  const auto step = r.get<std::uint64_t>();
  std::map<int64_t, std::vector<float>> residuals;
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) {
    const auto key = r.get<std::int64_t>();
    residuals[key] = r.get_floats();
  }
  std::lock_guard lock(mutex_);
  step_ = step;
  residuals_ = std::move(residuals);
}

PowerSgdHookState::PowerSgdHookState(const std::string& spec)
    : scope_(translated([&] { return comm::split_compression_scope(spec).first; })),
      ps_(translated([&] { return compression::PowerSgd::from_spec(comm::split_compression_scope(spec).second); })) {}

c10::intrusive_ptr<c10d::Work> PowerSgdHookState::allreduce(HopwiseBackend& pg, const at::Tensor& buffer,
                                                            const std::vector<at::Tensor>& gradients,
                                                            const std::vector<int64_t>& keys) {
  check_bucket(buffer, "powersgd hook");
  TORCH_CHECK_VALUE(gradients.size() == keys.size(), "hopwise: powersgd hook: ", gradients.size(), " gradients but ",
                    keys.size(), " keys");
  std::vector<comm::PowerSgdTensor> tensors;
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      const auto& g = gradients[i];
      TORCH_CHECK_VALUE(g.scalar_type() == at::kFloat && g.is_contiguous(),
                        "hopwise: powersgd hook: gradients must be contiguous float32");
      // Like torch's hook: the first dimension is the rows, the others flattened are the columns.
      const auto rows = static_cast<std::size_t>(g.dim() == 0 ? 1 : g.size(0));
      const auto cols = rows == 0 ? 0 : static_cast<std::size_t>(g.numel()) / rows;
      auto it = states_.find(keys[i]);
      if (it == states_.end() || (it->second.rows && (it->second.rows != rows || it->second.cols != cols)))
        it = states_.insert_or_assign(keys[i], compression::PowerSgdState(kSeed + static_cast<std::uint64_t>(keys[i])))
                 .first;
      auto* d = g.data_ptr<float>();
      tensors.push_back({d, d, rows, cols, &it->second});
    }
  }
  auto work = pg.make_work(c10d::OpType::ALLREDUCE, "hopwise:powersgd_all_reduce", {buffer});
  auto start = [this, &pg, tensors, gradients] {
    auto w =
        translated([&] { return pg.communicator().allreduce_powersgd_async(tensors, ps_, ReduceOp::kAvg, scope_); });
    std::uint64_t floats = 0;
    for (const auto& m : tensors) floats += m.rows * m.cols;
    pg.count_compressed_call(floats * sizeof(float));
    return std::vector{w};
  };
  pg.sequencer().launch(work, start);
  return work;
}

std::string PowerSgdHookState::save() const {
  std::lock_guard lock(mutex_);
  Writer w;
  w.put_string("hopwise-powersgd-hook/2");
  w.put_string(spec());
  w.put<std::uint64_t>(states_.size());
  for (const auto& [key, s] : states_) {
    w.put<std::int64_t>(key);
    w.put<std::uint64_t>(s.rows);
    w.put<std::uint64_t>(s.cols);
    w.put<std::uint64_t>(s.seed);
    w.put<std::uint64_t>(s.step);
    w.put<std::int32_t>(s.phase);
    for (const auto* v : {&s.q, &s.m, &s.p_hat, &s.q_local}) w.put_floats(*v);
  }
  return w.out;
}

void PowerSgdHookState::load(const std::string& bytes) {
  Reader r{bytes};
  TORCH_CHECK_VALUE(r.get_string() == "hopwise-powersgd-hook/2", "hopwise: not a saved PowerSGD hook state");
  const std::string spec = r.get_string();
  TORCH_CHECK_VALUE(spec == this->spec(), "hopwise: the saved hook state is of '", spec, "', this hook's is '",
                    this->spec(), "'");
  std::map<int64_t, compression::PowerSgdState> loaded;
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) {
    const auto key = r.get<std::int64_t>();
    const auto rows = r.get<std::uint64_t>(), cols = r.get<std::uint64_t>();
    compression::PowerSgdState s(r.get<std::uint64_t>());
    s.step = r.get<std::uint64_t>();
    s.phase = r.get<std::int32_t>();
    s.rows = rows;
    s.cols = cols;
    for (auto* v : {&s.q, &s.m, &s.p_hat, &s.q_local}) *v = r.get_floats();
    loaded.insert_or_assign(key, std::move(s));
  }
  std::lock_guard lock(mutex_);
  states_ = std::move(loaded);
}

}  // namespace hopwise::torch_backend
