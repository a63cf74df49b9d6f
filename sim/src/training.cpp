// A training step on simulated ranks (hopwise/sim/training.h): the reducer's schedule and the compressed recipes over
// an environment that is either the simulation (collectives through RankCollectives, simulated time) or a recorder (the
// calls listed, time only counted), so that trials can time each call before the steps run.
#include "hopwise/sim/training.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <span>

#include "algorithms/algorithms.h"
#include "compressed/compressed_recipe.h"
#include "compressed/powersgd_recipe.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "hopwise/training/averaging.h"
#include "reducer/schedule.h"

namespace hopwise::comm::sim {

std::size_t TrainingModel::parameters() const {
  std::size_t n = 0;
  for (const Layer& l : layers) n += l.rows * l.cols;
  return n;
}

namespace {

std::size_t parse_count(const std::string& s, const std::string& spec) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty() || v == 0 || v > (1ull << 36))
    throw InvalidArgument(
        fmt::format("model '{}': '{}' is not a layer; give RxC (a matrix) or N (a vector), "
                    "positive counts, comma-separated, or mnist or gpt2-small",
                    spec, s));
  return static_cast<std::size_t>(v);
}

// GPT-2 small (Radford et al. 2019; the Hugging Face layout): token and position embeddings, 12 blocks of
// attention and MLP with their layer norms, a final norm; the output layer shares the token embedding.
TrainingModel gpt2_small() {
  TrainingModel m{"gpt2-small", {}};
  const std::size_t d = 768;
  m.layers.push_back({"wte", 50257, d});
  m.layers.push_back({"wpe", 1024, d});
  for (int b = 0; b < 12; ++b) {
    const std::string h = fmt::format("h{}.", b);
    m.layers.push_back({h + "ln_1.weight", 1, d});
    m.layers.push_back({h + "ln_1.bias", 1, d});
    m.layers.push_back({h + "attn.c_attn.weight", d, 3 * d});
    m.layers.push_back({h + "attn.c_attn.bias", 1, 3 * d});
    m.layers.push_back({h + "attn.c_proj.weight", d, d});
    m.layers.push_back({h + "attn.c_proj.bias", 1, d});
    m.layers.push_back({h + "ln_2.weight", 1, d});
    m.layers.push_back({h + "ln_2.bias", 1, d});
    m.layers.push_back({h + "mlp.c_fc.weight", d, 4 * d});
    m.layers.push_back({h + "mlp.c_fc.bias", 1, 4 * d});
    m.layers.push_back({h + "mlp.c_proj.weight", 4 * d, d});
    m.layers.push_back({h + "mlp.c_proj.bias", 1, d});
  }
  m.layers.push_back({"ln_f.weight", 1, d});
  m.layers.push_back({"ln_f.bias", 1, d});
  return m;
}

}  // namespace

TrainingModel parse_model(const std::string& spec) {
  if (spec == "gpt2-small") return gpt2_small();
  TrainingModel m{spec, {}};
  // train_mnist's MLP (examples/train_mnist/mlp.h): each weight as PowerSGD sees it, in x out, then its bias.
  const std::string layers = spec == "mnist" ? "784x1024,1024,1024x1024,1024,1024x10,10" : spec;
  for (std::size_t at = 0; at <= layers.size();) {
    const std::size_t comma = std::min(layers.find(',', at), layers.size());
    const std::string item = layers.substr(at, comma - at);
    const std::size_t x = item.find('x');
    Layer l{fmt::format("layer{}", m.layers.size()), 1, 0};
    if (x == std::string::npos) {
      l.cols = parse_count(item, spec);
    } else {
      l.rows = parse_count(item.substr(0, x), spec);
      l.cols = parse_count(item.substr(x + 1), spec);
    }
    m.layers.push_back(l);
    at = comma + 1;
  }
  return m;
}

TrainingMethod parse_method(const std::string& spec) {
  TrainingMethod m;
  m.spec = spec;
  if (spec == "ddp") {
    m.ddp = true;
    return m;
  }
  const std::size_t slash = spec.find('/');
  const AveragingSpec avg = AveragingSpec::parse(spec.substr(0, slash));
  if (slash != std::string::npos) {
    if (avg.method != "sync")
      throw InvalidArgument(
          fmt::format("method '{}': a gradient codec (/CODEC) goes with sync only; async takes "
                      "codec=C among its fields",
                      spec));
    m.codec = spec.substr(slash + 1);
    if (m.codec.rfind("powersgd", 0) == 0)
      (void)compression::PowerSgd::from_spec(m.codec);  // its errors name the field
    else
      (void)compression::make_codec(m.codec);
  }
  if (avg.method == "sync") return m;
  if (avg.method == "gossip") {
    m.kind = TrainingMethod::Kind::kGossip;
    m.peers = avg.peers;
    m.codec = avg.codec;
    return m;
  }
  if (avg.method != "local" && avg.method != "async" && avg.method != "hier")
    throw InvalidArgument(
        fmt::format("method '{}': {} does not run on simulated ranks (sync, sync/CODEC, local, hier, "
                    "async, gossip and ddp do)",
                    spec, avg.method));
  m.kind = avg.method == "local"  ? TrainingMethod::Kind::kLocal
           : avg.method == "hier" ? TrainingMethod::Kind::kHier
                                  : TrainingMethod::Kind::kAsync;
  m.period = avg.period;
  m.delay = avg.delay > 0 ? avg.delay : avg.period;
  if (m.kind == TrainingMethod::Kind::kAsync) m.codec = avg.codec;
  return m;
}

namespace {

// The best of 3 timings of f, in seconds.
template <class F>
double best_of_3(F&& f) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

bool is_powersgd(const std::string& codec) { return codec.rfind("powersgd", 0) == 0; }

}  // namespace

CodecCosts measure_codec_costs(const std::string& codec) {
  CodecCosts c;
  if (codec == "none") return c;
  const std::size_t side = 2048, n = side * side;
  std::vector<float> grad(n), out(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& g : grad) g = normal(rng);
  if (is_powersgd(codec)) {
    const compression::PowerSgd ps = compression::PowerSgd::from_spec(codec);
    compression::PowerSgdState st(11);
    std::vector<float> p(ps.p_count(side, side)), q(ps.q_count(side, side));
    double p_s = 1e30, q_s = 1e30, d_s = 1e30;
    for (int i = 0; i < 4; ++i) {  // the first step draws Q: not counted
      const auto t0 = std::chrono::steady_clock::now();
      ps.compute_p(grad.data(), side, side, p.data(), st);
      const auto t1 = std::chrono::steady_clock::now();
      ps.compute_q(p.data(), side, side, q.data(), st);
      const auto t2 = std::chrono::steady_clock::now();
      ps.decompress(q.data(), side, side, out.data(), st);
      const auto t3 = std::chrono::steady_clock::now();
      if (i == 0) continue;
      p_s = std::min(p_s, std::chrono::duration<double>(t1 - t0).count());
      q_s = std::min(q_s, std::chrono::duration<double>(t2 - t1).count());
      d_s = std::min(d_s, std::chrono::duration<double>(t3 - t2).count());
    }
    c.p_s = p_s / n;
    c.q_s = q_s / n;
    c.decompress_s = d_s / n;
    return c;
  }
  const auto codec_ptr = compression::make_codec(codec);
  const compression::Codec& k = *codec_ptr;
  compression::CodecState st(5, 0, 2);
  std::vector<std::byte> payload(k.payload_bytes(n) + 64);
  std::vector<float> scales(k.scale_count(n));
  if (!scales.empty()) c.scales_s = best_of_3([&] { k.local_scales(grad.data(), n, scales.data(), st); }) / n;
  c.encode_s = best_of_3([&] { k.encode(grad.data(), n, payload.data(), st, scales.data()); }) / n;
  c.decode_s = best_of_3([&] { k.decode(payload.data(), n, out.data(), st, scales.data()); }) / n;
  return c;
}

CodecCosts codec_costs_at(const std::string& codec, double bytes_per_s) {
  CodecCosts c;
  if (codec == "none" || !(bytes_per_s > 0)) return c;
  const double per_float = sizeof(float) / bytes_per_s;
  if (is_powersgd(codec)) {
    c.p_s = c.q_s = c.decompress_s = per_float / 3;
  } else {
    c.encode_s = c.decode_s = per_float;
  }
  return c;
}

namespace {

// What a step's code calls: the simulation, or a recorder.
class StepEnv {
 public:
  virtual ~StepEnv() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual double now() = 0;
  virtual void sleep_for(double seconds) = 0;
  virtual void collective(Collective kind, void* in, void* out, std::size_t count, DataType dt, ReduceOp op) = 0;
  // An average among the ranks of this rank's host (hier's gradients).
  virtual void average_within_host(void* buf, std::size_t count) = 0;
  // A pass over `bytes` (a copy or scaling on the rank's own buffers), charged at the copy rate.
  virtual void pass(std::size_t bytes) = 0;
  // Memory for a buffer of `bytes` (phantom: never written).
  virtual void* scratch(std::size_t bytes) = 0;
  // Gossip's exchange: `bytes` to and from each of `partners` (ranks), posted now; finish_exchange() waits for them.
  virtual void start_exchange(const std::vector<int>& partners, std::size_t bytes) = 0;
  virtual void finish_exchange() = 0;
  // The planned ring (gossip pairs ranks along it).
  virtual const std::vector<int>& ring() const = 0;
};

// Lists the calls; the clock only counts.
class Recorder final : public StepEnv {
 public:
  explicit Recorder(int ranks) : ring_(static_cast<std::size_t>(ranks)), ranks_(ranks) {
    std::iota(ring_.begin(), ring_.end(), 0);  // rank 0's view: gossip finds its partners on it
  }
  int size() const override { return ranks_; }
  int rank() const override { return 0; }
  double now() override { return clock_; }
  void sleep_for(double s) override { clock_ += s; }
  void collective(Collective kind, void*, void*, std::size_t count, DataType dt, ReduceOp) override {
    calls.insert({kind, dt, count});
  }
  void average_within_host(void*, std::size_t) override {}  // no trials: the host's phases have one way
  void pass(std::size_t) override {}
  void* scratch(std::size_t) override { return nullptr; }
  void start_exchange(const std::vector<int>&, std::size_t) override {}
  void finish_exchange() override {}
  const std::vector<int>& ring() const override { return ring_; }
  std::set<StepCall> calls;

 private:
  std::vector<int> ring_;
  int ranks_;
  double clock_ = 0;
};

// One phantom region for every simulated rank (SimGrid runs them on one thread): grown by allocating a larger one
// (the old ones kept: a call in flight may still name them), never written, so its pages stay unallocated.
class PhantomMemory {
 public:
  void* get(std::size_t bytes) {
    if (regions_.empty() || sizes_.back() < bytes) {
      const std::size_t size = std::max<std::size_t>(bytes, std::size_t{1} << 20);
      regions_.push_back(std::unique_ptr<std::byte[]>(new std::byte[size]));  // left uninitialized: untouched
      sizes_.push_back(size);
    }
    return regions_.back().get();
  }

 private:
  std::vector<std::unique_ptr<std::byte[]>> regions_;
  std::vector<std::size_t> sizes_;
};

class Simulated final : public StepEnv {
 public:
  Simulated(Transport& t, RankCollectives& coll, const ChooseAlgorithm& choose, PhantomMemory& memory, bool ddp,
            const std::vector<int>& ring, double copy_rate)
      : t_(t), coll_(coll), choose_(choose), memory_(memory), ddp_(ddp), ring_(ring), copy_rate_(copy_rate) {}
  int size() const override { return t_.size(); }
  int rank() const override { return t_.rank(); }
  double now() override { return sim::now(); }
  void sleep_for(double s) override {
    if (s > 0) sim::sleep_for(s);
  }
  void collective(Collective kind, void* in, void* out, std::size_t count, DataType dt, ReduceOp op) override {
    const TuningChoice c = ddp_ ? TuningChoice{Algorithm::kRing} : choose_({kind, dt, count});
    coll_.run(c.algorithm, kind, in, out, count, dt, op, 0, c.chunk_bytes);
  }
  void average_within_host(void* buf, std::size_t count) override {
    coll_.allreduce_within_host(buf, buf, count, DataType::kFloat32, ReduceOp::kAvg);
  }
  // At the run's copy rate, as the work hook charges a copy (a copy onto itself would be no work at all).
  void pass(std::size_t bytes) override {
    if (copy_rate_ > 0) sim::sleep_for(static_cast<double>(bytes) / copy_rate_);
  }
  void* scratch(std::size_t bytes) override { return memory_.get(bytes); }
  void start_exchange(const std::vector<int>& partners, std::size_t bytes) override {
    void* buf = memory_.get(bytes);
    for (std::size_t j = 0; j < partners.size(); ++j) {  // tags as gossip_exchange.cpp's
      exchange_.push_back(t_.irecv(buf, bytes, partners[j], gossip_tag_ + static_cast<int>(j)));
      exchange_.push_back(t_.isend(buf, bytes, partners[j], gossip_tag_ + static_cast<int>(j)));
    }
  }
  void finish_exchange() override {
    t_.wait_all(exchange_);
    exchange_.clear();
  }
  const std::vector<int>& ring() const override { return ring_; }

 private:
  Transport& t_;
  RankCollectives& coll_;
  const ChooseAlgorithm& choose_;
  PhantomMemory& memory_;
  bool ddp_;
  const std::vector<int>& ring_;
  double copy_rate_;
  std::vector<Request> exchange_;
  const int gossip_tag_ = reserved_tags("gossip").first;
};

// The compressed recipe's backend (compressed_recipe.h): the codec's sizes, its work charged, its bytes moved.
class CodecBackend {
 public:
  CodecBackend(StepEnv& env, const compression::Codec& c, const CodecCosts& costs, std::size_t n, double& wire)
      : env_(env), c_(c), costs_(costs), n_(n), wire_(wire) {}
  std::size_t scale_count() const { return c_.scale_count(n_); }
  std::size_t payload_bytes() const { return c_.payload_bytes(n_); }
  std::size_t gather_stride() const { return payload_bytes(); }
  bool aggregatable() const { return c_.pattern() == compression::Pattern::kAggregatable; }
  float* scales() { return static_cast<float*>(env_.scratch(scale_count() * sizeof(float))); }
  std::byte* payload() { return static_cast<std::byte*>(env_.scratch(payload_bytes())); }
  std::byte* gathered() {
    return static_cast<std::byte*>(env_.scratch(payload_bytes() * static_cast<std::size_t>(env_.size())));
  }
  void local_scales(float*) { work(costs_.scales_s); }
  void allreduce_max(float* s, std::size_t k) {
    env_.collective(Collective::kAllreduce, s, s, k, DataType::kFloat32, ReduceOp::kMax);
  }
  void encode(std::byte*, const float*) { work(costs_.encode_s); }
  void allreduce_payload(std::byte* p) {
    env_.collective(Collective::kAllreduce, p, p, c_.payload_count(n_), c_.payload_dtype(), ReduceOp::kSum);
  }
  void allgather_payloads(const std::byte* mine, std::byte* all) {
    env_.collective(Collective::kAllgather, const_cast<std::byte*>(mine), all, payload_bytes(), DataType::kUInt8,
                    ReduceOp::kSum);
  }
  void before_gathered_decode() {}
  void decode(const std::byte*, const float*) { work(costs_.decode_s); }
  void decode_add(const std::byte*, const float*) { work(costs_.decode_s); }
  void divide_by_ranks() { env_.pass(n_ * sizeof(float)); }
  void add_wire_bytes(std::size_t b) { wire_ += static_cast<double>(b); }

 private:
  void work(double per_float) { env_.sleep_for(per_float * static_cast<double>(n_)); }
  StepEnv& env_;
  const compression::Codec& c_;
  const CodecCosts& costs_;
  std::size_t n_;
  double& wire_;
};

// PowerSGD's recipe backend (powersgd_recipe.h), in its steady state (past any warm-up).
class PowerSgdBackend {
 public:
  using M = Layer;
  PowerSgdBackend(StepEnv& env, const compression::PowerSgd& ps, const CodecCosts& costs, double& wire)
      : env_(env), ps_(ps), costs_(costs), wire_(wire) {}
  bool compressed_step(const M& m) const { return compresses(m); }
  bool compresses(const M& m) const { return ps_.compresses(m.rows, m.cols); }
  void skip(const M&) const {}
  std::size_t p_count(const M& m) const { return ps_.p_count(m.rows, m.cols); }
  std::size_t q_count(const M& m) const { return ps_.q_count(m.rows, m.cols); }
  void allreduce_plain(const std::vector<const M*>& plain, ReduceOp) {
    std::size_t total = 0;
    for (const M* m : plain) total += m->rows * m->cols;
    void* buf = env_.scratch(total * sizeof(float));
    env_.pass(total * sizeof(float));  // packed into one buffer, and back
    env_.collective(Collective::kAllreduce, buf, buf, total, DataType::kFloat32, ReduceOp::kSum);
    env_.pass(total * sizeof(float));
  }
  float* factors(std::size_t floats) { return static_cast<float*>(env_.scratch(floats * sizeof(float))); }
  void compute_p(const M& m, float*) { work(m, costs_.p_s); }
  void allreduce_p(float* p, std::size_t n) {
    env_.collective(Collective::kAllreduce, p, p, n, DataType::kFloat32, ReduceOp::kSum);
  }
  void compute_q(const float*, const M& m, float*) { work(m, costs_.q_s); }
  void allreduce_q(float* q, std::size_t n, ReduceOp) {
    env_.collective(Collective::kAllreduce, q, q, n, DataType::kFloat32, ReduceOp::kSum);
  }
  void decompress(const float*, const M& m) { work(m, costs_.decompress_s); }
  void add_wire_bytes(std::size_t b) { wire_ += static_cast<double>(b); }
  void finish(std::span<const M> matrices, ReduceOp) {  // the host's average: every output divided
    std::size_t total = 0;
    for (const M& m : matrices) total += m.rows * m.cols;
    env_.pass(total * sizeof(float));
  }

 private:
  void work(const M& m, double per_float) { env_.sleep_for(per_float * static_cast<double>(m.rows * m.cols)); }
  StepEnv& env_;
  const compression::PowerSgd& ps_;
  const CodecCosts& costs_;
  double& wire_;
};

// The parameters' (or a snapshot's) average over the world, as the averagers make it.
void average_model(StepEnv& env, std::size_t n, const std::string& codec, const CodecCosts& costs, double& wire) {
  void* x = env.scratch(n * sizeof(float));
  if (codec == "none") {
    env.collective(Collective::kAllreduce, x, x, n, DataType::kFloat32, ReduceOp::kAvg);
    wire += static_cast<double>(n * sizeof(float));
    return;
  }
  const auto c = compression::make_codec(codec + ":ef=1");
  CodecBackend b(env, *c, costs, n, wire);
  compressed::allreduce(b, n, ReduceOp::kAvg, env.size());
}

ReducerOptions bucket_options(const TrainingMethod& method, const StepSettings& s) {
  ReducerOptions options;
  options.bucket_mb = s.bucket_mb;
  options.first_bucket_mb = s.first_bucket_mb;
  options.compression = method.codec;
  options.rebuild = false;
  options.tune_steps = false;
  return options;
}

// The reducer's buckets over the model's gradients, laid out once for a period's steps. Every simulated rank
// registers the same model: the layout agreement holds by construction, so the schedule's own collectives answer
// locally (buffers are phantom: a gathered fingerprint would hold nothing).
struct ModelBuckets {
  ReducerOptions options;
  reducer::Schedule schedule;
  ModelBuckets(const StepEnv& env, const TrainingModel& model, const TrainingMethod& method, const StepSettings& s)
      : options(bucket_options(method, s)),
        schedule(
            options, env.rank(), "simulated gradient",
            reducer::Collectives{[n = env.size()](std::uint64_t v) { return std::vector<std::uint64_t>(n, v); },
                                 [](std::vector<std::int32_t>&) {}, [](std::vector<double>&) {}},
            [] {}, false) {
    for (const Layer& l : model.layers) schedule.add(l.name, l.rows, l.cols);
    schedule.finalize();
  }
  ModelBuckets(const ModelBuckets&) = delete;  // the schedule holds a reference to `options`
  ModelBuckets& operator=(const ModelBuckets&) = delete;
};

// One step's backward with the reducer's buckets: gradients ready in backward order, each after its share of the
// backward's time; every complete bucket launched in bucket order (the launch takes the actor, as the progress
// thread runs one call at a time), the step over when both backward and the last bucket are done.
void sync_step(StepEnv& env, const TrainingModel& model, const TrainingMethod& method, const StepSettings& s,
               reducer::Schedule& schedule, StepResult& r, bool within_host = false) {
  r.buckets = static_cast<int>(schedule.buckets().size());

  std::unique_ptr<compression::Codec> codec;
  std::optional<compression::PowerSgd> powersgd;
  if (is_powersgd(method.codec))
    powersgd.emplace(compression::PowerSgd::from_spec(method.codec));
  else if (method.codec != "none")
    codec = compression::make_codec(method.codec);
  auto launch = [&](int k) {
    const reducer::Bucket& b = schedule.buckets()[static_cast<std::size_t>(k)];
    if (powersgd) {
      std::vector<Layer> matrices;
      for (int i : b.gradients) matrices.push_back(model.layers[static_cast<std::size_t>(i)]);
      PowerSgdBackend backend(env, *powersgd, s.costs, r.wire_bytes);
      compressed::powersgd_allreduce(backend, std::span<const Layer>(matrices), ReduceOp::kAvg);
    } else if (codec) {
      CodecBackend backend(env, *codec, s.costs, b.count, r.wire_bytes);
      compressed::allreduce(backend, b.count, ReduceOp::kAvg, env.size());
    } else if (within_host) {  // the host's loopback, not the wire
      env.average_within_host(env.scratch(b.count * sizeof(float)), b.count);
    } else {
      void* buf = env.scratch(b.count * sizeof(float));
      env.collective(Collective::kAllreduce, buf, buf, b.count, DataType::kFloat32, ReduceOp::kAvg);
      r.wire_bytes += static_cast<double>(b.count * sizeof(float));
    }
  };
  const double t0 = env.now();
  const double backward_from = t0 + s.compute_s * (1 - s.backward_share),
               total = static_cast<double>(model.parameters());
  double done = 0;
  for (std::size_t i = model.layers.size(); i-- > 0;) {
    done += static_cast<double>(model.layers[i].rows * model.layers[i].cols);
    const double ready = backward_from + s.compute_s * s.backward_share * done / total;
    if (env.now() < ready) env.sleep_for(ready - env.now());
    schedule.mark_ready(static_cast<int>(i));
    schedule.launch_ready(launch);
  }
  schedule.begin_finish(launch);
  if (env.now() < t0 + s.compute_s) env.sleep_for(t0 + s.compute_s - env.now());
  schedule.end_step([] {});  // every bucket is done (each launch returned with its call): marks reset
}

// Gossip's step in its steady state: the model (or, with a codec, its encoded difference) sent to and received
// from this step's partners while the step computes (started after the last optimizer step), then the mix.
void gossip_step(StepEnv& env, std::size_t n, const TrainingMethod& m, const StepSettings& s, StepResult& r) {
  const std::vector<int>& ring = env.ring();
  const int size = env.size();
  const int position = static_cast<int>(std::find(ring.begin(), ring.end(), env.rank()) - ring.begin());
  const int per_step = std::min(m.peers, std::max(1, size - 1));
  std::vector<int> partners;
  for (int j = 0; j < per_step; ++j)
    if (const int q = gossip_partner(position, size, j); q >= 0) partners.push_back(ring[static_cast<std::size_t>(q)]);
  std::size_t bytes = n * sizeof(float);
  const double per_float = static_cast<double>(n);
  if (m.codec != "none") {  // the difference's scales and encode, and this rank's own decode (gossip_exchange.cpp)
    const auto c = compression::make_codec(m.codec);
    bytes = c->scale_count(n) * sizeof(float) + c->payload_bytes(n);
    env.pass(n * sizeof(float));
    env.sleep_for((s.costs.scales_s + s.costs.encode_s + s.costs.decode_s) * per_float);
  }
  env.start_exchange(partners, bytes);
  r.wire_bytes += static_cast<double>(bytes * partners.size());
  env.sleep_for(s.compute_s);
  env.finish_exchange();
  if (m.codec != "none") env.sleep_for(s.costs.decode_s * per_float * static_cast<double>(partners.size()));
  env.pass((partners.size() + 1) * n * sizeof(float));  // the mix reads every model once
}

StepResult run_period(StepEnv& env, const TrainingModel& model, const TrainingMethod& method, const StepSettings& s) {
  StepResult r;
  const double t0 = env.now();
  const std::size_t n = model.parameters();
  switch (method.kind) {
    case TrainingMethod::Kind::kSync: {
      ModelBuckets buckets(env, model, method, s);
      sync_step(env, model, method, s, buckets.schedule, r);
      break;
    }
    case TrainingMethod::Kind::kLocal:  // H steps of compute, then the parameters averaged (blocking)
      r.steps = method.period;
      env.sleep_for(s.compute_s * method.period);
      average_model(env, n, "none", s.costs, r.wire_bytes);
      break;
    case TrainingMethod::Kind::kHier: {  // H steps with the gradients averaged within each host, then the world's
      r.steps = method.period;
      ModelBuckets buckets(env, model, method, s);
      for (int k = 0; k < method.period; ++k) sync_step(env, model, method, s, buckets.schedule, r, true);
      average_model(env, n, "none", s.costs, r.wire_bytes);
      break;
    }
    case TrainingMethod::Kind::kGossip: gossip_step(env, n, method, s, r); break;
    case TrainingMethod::Kind::kAsync: {  // the snapshot's average beside D steps of compute, applied, H - D more
      r.steps = method.period;
      average_model(env, n, method.codec, s.costs, r.wire_bytes);
      const double applied = t0 + s.compute_s * method.delay;
      if (env.now() < applied) env.sleep_for(applied - env.now());
      env.pass(3 * n * sizeof(float));  // x += average - snapshot; the next snapshot
      env.sleep_for(s.compute_s * (method.period - method.delay));
      break;
    }
  }
  r.compute_s = s.compute_s * r.steps;
  r.period_s = env.now() - t0;
  return r;
}

}  // namespace

std::vector<StepCall> step_calls(int ranks, const TrainingModel& model, const TrainingMethod& method,
                                 const StepSettings& settings) {
  Recorder rec(ranks);
  run_period(rec, model, method, settings);
  return {rec.calls.begin(), rec.calls.end()};
}

StepResult simulate_step(const std::vector<std::string>& hosts, const std::vector<int>& ring,
                         const std::vector<int>& host_of_rank, std::size_t chunk_bytes, RunOptions run,
                         const TrainingModel& model, const TrainingMethod& method, const StepSettings& settings,
                         const ChooseAlgorithm& choose) {
  if (model.parameters() == 0) throw InvalidArgument(fmt::format("model '{}' has no parameters", model.name));
  run.real_payloads = false;
  const int n = static_cast<int>(hosts.size());
  std::vector<int> order = ring;
  if (method.ddp)
    for (int r = 0; r < n; ++r) order[static_cast<std::size_t>(r)] = r;
  PhantomMemory memory;
  std::vector<StepResult> results(static_cast<std::size_t>(n));
  run_ranks(
      hosts,
      [&](int me, Transport& t) {
        RankCollectives coll(t, order, host_of_rank, chunk_bytes, true);
        Simulated env(t, coll, choose, memory, method.ddp, order, run.copy_bytes_per_s);
        coll.run(Algorithm::kRing, Collective::kBarrier, nullptr, nullptr, 0, DataType::kFloat32);  // start together
        results[static_cast<std::size_t>(me)] = run_period(env, model, method, settings);
      },
      run);
  StepResult r = results[0];
  for (const StepResult& x : results) r.period_s = std::max(r.period_s, x.period_s);
  r.calls = step_calls(n, model, method, settings);
  return r;
}

}  // namespace hopwise::comm::sim
