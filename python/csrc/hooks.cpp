#include "hooks.h"

#include <fmt/core.h>

#include <cstring>

#include <c10/util/Exception.h>

#include "hopwise/common/error.h"
#include "tensors.h"

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

template <class F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace

CodecHookState::CodecHookState(const std::string& spec, int rank, int size)
    : codec_(translated([&] { return compression::make_codec(spec); })), rank_(rank), size_(size) {}

c10::intrusive_ptr<c10d::Work> CodecHookState::allreduce(ProcessGroupHopwise& pg, const at::Tensor& buffer,
                                                         int64_t bucket) {
  check_bucket(buffer, "compression_hook");
  auto& c = pg.communicator();
  TORCH_CHECK_VALUE(c.rank() == rank_ && c.size() == size_, "hopwise: this hook state was made for rank ", rank_, " of ",
                    size_, ", not for this group's rank ", c.rank(), " of ", c.size());
  compression::CodecState* state;
  {
    std::lock_guard lock(mutex_);
    auto it = states_.find(bucket);
    if (it == states_.end())
      it = states_.emplace(bucket, compression::CodecState(kSeed + static_cast<std::uint64_t>(bucket), rank_, size_)).first;
    state = &it->second;
    // DDP rebuilds its buckets once (after the first step): a residual of another size is not this bucket's.
    if (!state->residual.empty() && state->residual.size() != static_cast<std::size_t>(buffer.numel()))
      *state = compression::CodecState(kSeed + static_cast<std::uint64_t>(bucket), rank_, size_);
  }
  auto work = pg.make_work(c10d::OpType::ALLREDUCE, "hopwise:compressed_all_reduce", {buffer});
  auto* data = buffer.data_ptr<float>();
  auto w = translated([&] {
    return c.allreduce_compressed_async(data, data, static_cast<std::size_t>(buffer.numel()), *codec_, *state,
                                        ReduceOp::kAvg);
  });
  complete_after({w}, work);
  return work;
}

std::string CodecHookState::save() const {
  std::lock_guard lock(mutex_);
  Writer w;
  w.put_string("hopwise-codec-hook/1");
  w.put_string(codec_->name());
  w.put<std::uint64_t>(states_.size());
  for (const auto& [bucket, s] : states_) {
    w.put<std::int64_t>(bucket);
    w.put<std::uint64_t>(s.seed);
    w.put<std::uint64_t>(s.step);
    w.put_floats(s.residual);
  }
  return w.out;
}

void CodecHookState::load(const std::string& bytes) {
  Reader r{bytes};
  TORCH_CHECK_VALUE(r.get_string() == "hopwise-codec-hook/1", "hopwise: not a saved codec hook state");
  const std::string spec = r.get_string();
  TORCH_CHECK_VALUE(spec == codec_->name(), "hopwise: the saved hook state is of codec '", spec, "', this hook's is '",
                    codec_->name(), "'");
  std::lock_guard lock(mutex_);
  std::map<int64_t, compression::CodecState> loaded;
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) {
    const auto bucket = r.get<std::int64_t>();
    compression::CodecState s;
    s.seed = r.get<std::uint64_t>();
    s.step = r.get<std::uint64_t>();
    s.residual = r.get_floats();
    loaded.emplace(bucket, std::move(s));
  }
  for (auto& [bucket, s] : loaded) {
    s.rank = rank_;
    s.world_size = size_;
  }
  states_ = std::move(loaded);
}

PowerSgdHookState::PowerSgdHookState(const std::string& spec)
    : ps_(translated([&] { return compression::PowerSgd::from_spec(spec); })) {}

c10::intrusive_ptr<c10d::Work> PowerSgdHookState::allreduce(ProcessGroupHopwise& pg, const at::Tensor& buffer,
                                                            const std::vector<at::Tensor>& gradients, int64_t bucket) {
  check_bucket(buffer, "powersgd hook");
  std::vector<comm::PowerSgdTensor> tensors;
  {
    std::lock_guard lock(mutex_);
    Bucket& b = buckets_[bucket];
    std::vector<std::pair<std::size_t, std::size_t>> shapes;
    for (const auto& g : gradients) {
      TORCH_CHECK_VALUE(g.scalar_type() == at::kFloat && g.is_contiguous(),
                        "hopwise: powersgd hook: gradients must be contiguous float32");
      // Like torch's hook: the first dimension is the rows, the others flattened are the columns.
      const auto rows = static_cast<std::size_t>(g.dim() == 0 ? 1 : g.size(0));
      shapes.emplace_back(rows, rows == 0 ? 0 : static_cast<std::size_t>(g.numel()) / rows);
    }
    if (shapes != b.shapes) {  // new, or rebuilt by DDP after the first step: start afresh
      b.shapes = shapes;
      b.states.clear();
      for (std::size_t i = 0; i < shapes.size(); ++i)
        b.states.emplace_back(kSeed + static_cast<std::uint64_t>(bucket) * 1000003u + i);
    }
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      auto* d = gradients[i].data_ptr<float>();
      tensors.push_back({d, d, shapes[i].first, shapes[i].second, &b.states[i]});
    }
  }
  auto work = pg.make_work(c10d::OpType::ALLREDUCE, "hopwise:powersgd_all_reduce", {buffer});
  auto w = translated([&] {
    return pg.communicator().allreduce_powersgd_async(tensors, ps_, ReduceOp::kAvg);
  });
  complete_after({w}, work);
  return work;
}

std::string PowerSgdHookState::save() const {
  std::lock_guard lock(mutex_);
  Writer w;
  w.put_string("hopwise-powersgd-hook/1");
  w.put_string(ps_.name());
  w.put<std::uint64_t>(buckets_.size());
  for (const auto& [bucket, b] : buckets_) {
    w.put<std::int64_t>(bucket);
    w.put<std::uint64_t>(b.states.size());
    for (std::size_t i = 0; i < b.states.size(); ++i) {
      const auto& s = b.states[i];
      w.put<std::uint64_t>(b.shapes[i].first);
      w.put<std::uint64_t>(b.shapes[i].second);
      w.put<std::uint64_t>(s.seed);
      w.put<std::uint64_t>(s.step);
      w.put<std::int32_t>(s.phase);
      for (const auto* v : {&s.q, &s.m, &s.p_hat, &s.q_local}) w.put_floats(*v);
    }
  }
  return w.out;
}

void PowerSgdHookState::load(const std::string& bytes) {
  Reader r{bytes};
  TORCH_CHECK_VALUE(r.get_string() == "hopwise-powersgd-hook/1", "hopwise: not a saved PowerSGD hook state");
  const std::string spec = r.get_string();
  TORCH_CHECK_VALUE(spec == ps_.name(), "hopwise: the saved hook state is of '", spec, "', this hook's is '",
                    ps_.name(), "'");
  std::map<int64_t, Bucket> loaded;
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) {
    Bucket& b = loaded[r.get<std::int64_t>()];
    for (auto k = r.get<std::uint64_t>(); k > 0; --k) {
      const auto rows = r.get<std::uint64_t>(), cols = r.get<std::uint64_t>();
      b.shapes.emplace_back(rows, cols);
      compression::PowerSgdState s(r.get<std::uint64_t>());
      s.step = r.get<std::uint64_t>();
      s.phase = r.get<std::int32_t>();
      s.rows = rows;
      s.cols = cols;
      for (auto* v : {&s.q, &s.m, &s.p_hat, &s.q_local}) *v = r.get_floats();
      b.states.push_back(std::move(s));
    }
  }
  std::lock_guard lock(mutex_);
  buckets_ = std::move(loaded);
}

}  // namespace hopwise::torch_backend
