// train_mnist: data-parallel training of an MLP on Fashion-MNIST, each layer's gradient handed to hopwise's
// bucketed reducer as soon as backward produces it, and the model averaged as --averaging says.
//   mpirun -np 4 build/bin/train_mnist --epochs 5 [--averaging local:period=8] [--target-accuracy 0.85]
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include "checkpoint.h"
#include "hopwise/comm/averaging.h"
#include "hopwise/comm/communicator.h"
#include "hopwise/comm/monitor.h"
#include "hopwise/comm/reducer.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "mlp.h"
#include "mnist.h"
#include "report.h"

namespace {

using Clock = std::chrono::steady_clock;
using hopwise::InvalidArgument;
namespace hc = hopwise::comm;

struct Flags {
  int epochs = 5, batch = 128, hidden = 1024;
  float lr = 0.05f, momentum = 0.9f;
  std::string compression = hopwise::env::get_or("HOPWISE_COMPRESSION", "none");
  double bucket_mb = 1;
  bool tune_bucket = false;  // --bucket-mb auto
  int chunks = 4;            // column blocks per weight gradient, each handed to the reducer when done
  bool overlap = true;
  std::string algo = "auto", trace = hopwise::env::get_or("HOPWISE_TRACE_FILE", ""), json;
  std::uint64_t seed = 1;
  std::size_t limit = 0;  // use only the first N training images (0 = all)
  std::string averaging = hopwise::env::get_or("HOPWISE_AVERAGING", "sync");
  double target = 0;    // --target-accuracy (a fraction)
  int eval_every = 20;  // steps between the probes while the target is not reached
  std::string checkpoint, resume;
  hc::MonitorOptions monitor = hc::MonitorOptions::from_env();
  int straggler = -1;  // --straggle RANK:MS: this rank sleeps MS in every step's compute
  double straggle_ms = 0;
};

constexpr const char* kUsage = R"(usage: mpirun -np N train_mnist [options]
       torchrun --nproc_per_node N --redirects 1 --tee 1 --no_python train_mnist [options]
  --epochs N        passes over the training set (default 5)
  --batch N         global batch, split evenly across ranks (default 128)
  --lr X            learning rate of SGD with momentum 0.9 (default 0.05)
  --hidden N        width of the two hidden layers (default 1024: 784-1024-1024-10)
  --compression S   gradient codec spec, e.g. fp16, int8, topk:ratio=0.01, powersgd:rank=4 (default none /
                    HOPWISE_COMPRESSION)
  --bucket-mb X     gradient bucket cap in MB (default 1; the first bucket is at most 1 MB); auto: measured in the
                    first steps (caps 1, 2, 4, 8, 25 MB, 5 steps each; the fastest stays)
  --chunks N        hand each weight gradient to the reducer in N column blocks, each as soon as it is computed,
                    so that even the first layer's (the last to finish) overlaps its own computation (default 4)
  --no-overlap      all-reduce only after backward finished (the baseline)
  --algo A          auto | ring | hd | tree | direct | shm | native
  --averaging S     sync (default; HOPWISE_AVERAGING) | local:period=H[,warmup=W] | hier:period=H |
                    gossip[:peers=K][,codec=fp16|bf16|int8] | async:period=H  (fewer synchronization points;
                    every epoch ends with one full average and a test evaluation)
  --target-accuracy X  evaluate the ranks' mean model every --eval-every steps (off the clock, the ranks' models
                    untouched) until the test accuracy reaches X (e.g. 0.85); report the seconds and epochs to it
  --eval-every N    steps between those evaluations (default 20)
  --checkpoint PATH after each epoch write PATH.rankR (parameters, momentum, the averaging method's state)
  --resume PATH     start from PATH.rankR, after the epochs it holds (same --averaging, --hidden and ranks)
  --monitor SPEC    a line per interval on rank 0, e.g. interval=10s[,every=10][,alert_after=3] (HOPWISE_MONITOR)
  --util-alert X    alert when utilization stays below X (0.5 or 50%) for alert_after intervals (HOPWISE_UTIL_ALERT)
  --metrics-file P  Prometheus text file, rewritten atomically each interval (HOPWISE_METRICS_FILE)
  --metrics-json P  JSON lines: every step's per-rank figures, each interval, each alert (HOPWISE_METRICS_JSON)
  --straggle R:MS   rank R sleeps MS ms in every step's compute (a straggler, to see the monitor name it)
  --trace FILE      Chrome/Perfetto trace of compute and bucket communication (HOPWISE_TRACE_FILE)
  --seed N          initialization and shuffling seed (default 1)
  --json FILE       write the summary as JSON
  --limit N         train on the first N images only
)";

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument(a + " needs a value; see train_mnist --help");
      return argv[++i];
    };
    auto num = [&](const std::string& v) {
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || d < 0)
        throw InvalidArgument(a + " '" + v + "' is not a non-negative number");
      return d;
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--epochs")
      f.epochs = static_cast<int>(num(val()));
    else if (a == "--batch")
      f.batch = static_cast<int>(num(val()));
    else if (a == "--lr")
      f.lr = static_cast<float>(num(val()));
    else if (a == "--hidden")
      f.hidden = static_cast<int>(num(val()));
    else if (a == "--compression")
      f.compression = val();
    else if (a == "--chunks")
      f.chunks = static_cast<int>(num(val()));
    else if (a == "--bucket-mb") {
      const std::string v = val();
      if (v == "auto")
        f.tune_bucket = true;
      else
        f.bucket_mb = num(v);
    } else if (a == "--no-overlap")
      f.overlap = false;
    else if (a == "--algo")
      f.algo = val();
    else if (a == "--trace")
      f.trace = val();
    else if (a == "--seed")
      f.seed = static_cast<std::uint64_t>(num(val()));
    else if (a == "--json")
      f.json = val();
    else if (a == "--limit")
      f.limit = static_cast<std::size_t>(num(val()));
    else if (a == "--averaging")
      f.averaging = val();
    else if (a == "--target-accuracy") {
      f.target = num(val());
      if (f.target > 1) throw InvalidArgument("--target-accuracy is a fraction of the test set, e.g. 0.85");
    } else if (a == "--eval-every")
      f.eval_every = static_cast<int>(num(val()));
    else if (a == "--checkpoint")
      f.checkpoint = val();
    else if (a == "--resume")
      f.resume = val();
    else if (a == "--monitor") {
      const auto keep = f.monitor;
      f.monitor = hc::MonitorOptions::parse(val());
      f.monitor.util_alert = keep.util_alert;
      f.monitor.metrics_file = keep.metrics_file;
      f.monitor.json_file = keep.json_file;
    } else if (a == "--util-alert")
      f.monitor.util_alert = hc::MonitorOptions::parse_threshold(val());
    else if (a == "--metrics-file") {
      f.monitor.metrics_file = val();
      f.monitor.on = true;
    } else if (a == "--metrics-json") {
      f.monitor.json_file = val();
      f.monitor.on = true;
    } else if (a == "--straggle") {
      const std::string v = val();
      const std::size_t colon = v.find(':');
      if (colon == std::string::npos)
        throw InvalidArgument("--straggle '" + v + "': write RANK:MS, e.g. 1:30 (rank 1 sleeps 30 ms a step)");
      f.straggler = static_cast<int>(num(v.substr(0, colon)));
      f.straggle_ms = num(v.substr(colon + 1));
    } else
      throw InvalidArgument("unknown option '" + a + "'; see train_mnist --help");
  }
  if (f.batch < 1 || f.hidden < 1 || f.bucket_mb <= 0 || f.chunks < 1 || f.eval_every < 1)
    throw InvalidArgument("--batch, --hidden, --chunks, --eval-every and --bucket-mb must be positive");
  const auto method = hc::AveragingSpec::parse(f.averaging);  // a bad spec fails here, naming the field
  if (method.method == "hier" && f.compression != "none")
    throw InvalidArgument("--averaging hier averages gradients within each host uncompressed; drop --compression");
  // A bad spec fails here, with the codec's own message.
  if (const auto spec = hopwise::compression::parse_codec_spec(f.compression); spec.name == "powersgd")
    hopwise::compression::PowerSgd::from_spec(spec);
  else if (spec.name != "none")
    hopwise::compression::make_codec(spec);
  return f;
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Test accuracy of the model as it is on every rank: each rank scores a slice, the counts are summed.
double evaluate(hc::Communicator& comm, hopwise::examples::Mlp& model, const hopwise::examples::Dataset& test, int px) {
  std::vector<int> pred;
  std::int64_t correct = 0;
  const int p = comm.size(), rank = comm.rank();
  const std::size_t per = (test.size() + static_cast<std::size_t>(p) - 1) / static_cast<std::size_t>(p);
  const std::size_t lo = std::min(test.size(), per * static_cast<std::size_t>(rank)),
                    hi = std::min(test.size(), lo + per);
  for (std::size_t a = lo; a < hi; a += 1000) {
    const int n = static_cast<int>(std::min<std::size_t>(1000, hi - a));
    model.predict(test.images.data() + a * px, n, pred);
    for (int j = 0; j < n; ++j)
      correct += pred[static_cast<std::size_t>(j)] == test.labels[a + static_cast<std::size_t>(j)];
  }
  comm.allreduce(&correct, &correct, 1, hopwise::DataType::kInt64, hopwise::ReduceOp::kSum);
  return static_cast<double>(correct) / static_cast<double>(test.size());
}

int run(int argc, char** argv) {
  hc::Communicator comm;
  const int rank = comm.rank(), p = comm.size();
  Flags f;
  try {
    f = parse(argc, argv);
    if (f.batch % p != 0)
      throw InvalidArgument(
          fmt::format("--batch {} is not a multiple of the {} ranks; use e.g. {}", f.batch, p, (f.batch / p + 1) * p));
  } catch (const InvalidArgument& e) {
    if (rank == 0) std::fprintf(stderr, "train_mnist: %s\n", e.what());
    return 2;
  }
  if (f.straggler >= p) {
    if (rank == 0)
      std::fprintf(stderr, "train_mnist: --straggle rank %d: the job has ranks 0-%d\n", f.straggler, p - 1);
    return 2;
  }
  comm.set_algorithm(hc::parse_algorithm(f.algo));
  const std::string dir = hopwise::examples::default_mnist_dir();
  auto train = hopwise::examples::load_fashion_mnist(dir, "train");
  const auto test = hopwise::examples::load_fashion_mnist(dir, "t10k");
  const int px = train.rows * train.cols;
  const std::size_t n_train = f.limit ? std::min(f.limit, train.size()) : train.size();

  hopwise::examples::Mlp model({px, f.hidden, f.hidden, 10}, f.seed, f.chunks);
  std::string resumed_state;
  hc::ReducerOptions ro;
  ro.bucket_mb = f.bucket_mb;
  ro.tune_bucket = f.tune_bucket;
  ro.first_bucket_mb = std::min(1.0, f.bucket_mb);
  ro.overlap = f.overlap;
  ro.compression = f.compression;
  hc::GradientReducer reducer(comm, ro);
  for (const auto& t : model.tensors()) reducer.add_parameter(t.name, model.grads() + t.offset, t.rows, t.cols);
  reducer.finalize();
  int first_epoch = 0;
  if (!f.resume.empty()) {
    const auto c =
        hopwise::examples::load_checkpoint(comm, f.resume, model.params(), model.velocity(), model.parameter_count());
    if (c.ranks != p)
      throw InvalidArgument(fmt::format("--resume {}: saved by {} ranks, this job has {}", f.resume, c.ranks, p));
    first_epoch = c.epochs_done;
    resumed_state = c.averaging;
  }
  // Rank 0's parameters to every rank (identical after a checkpoint's full average, or the same seed).
  hc::ModelAverager averager(comm, hc::AveragingSpec::parse(f.averaging), model.params(), model.parameter_count());
  if (!resumed_state.empty()) averager.load(resumed_state);

  if (rank == 0) {
    const std::size_t hosts = comm.cluster() ? comm.cluster()->hosts.size() : (comm.local_size() == p ? 1 : 0);
    fmt::print("train_mnist: {} ranks over {} on {} host(s), Fashion-MNIST {} train / {} test images from {}\n", p,
               comm.transport().name(), hosts ? std::to_string(hosts) : std::string("several"), n_train, test.size(),
               dir);
    if (!comm.plan_description().empty()) fmt::print("topology plan, {}", comm.plan_description());
    std::string ring;
    for (int r : comm.ring_order()) ring += (ring.empty() ? "" : "→") + std::to_string(r);
    fmt::print("communicator: ring {} ({}); {}; cost model {}\n", ring,
               comm.plan_description().empty() ? "rank order: topology discovery is off" : "planned",
               comm.local_size() == p ? "one host (shared-memory slots)" : "several hosts",
               comm.cost_model().params().source);
    const auto names = reducer.bucket_names();
    std::size_t k = 0;
    for (const auto& b : names) {
      std::size_t count = 0;
      for (const auto& t : model.tensors())
        if (std::find(b.begin(), b.end(), t.name) != b.end()) count += t.count;
      fmt::print("  bucket {}: {} ({:.2f} MB) -> {}\n", k++, fmt::join(b, ", "), count * 4 / 1e6,
                 f.compression == "none"
                     ? std::string(hc::to_string(comm.algorithm_for(hc::Collective::kAllreduce, count * 4))) +
                           (comm.tuned_choice(hc::Collective::kAllreduce, count * 4)
                                ? ""
                                : " (cost model; tuned in the first steps)")
                     : f.compression + " (its payloads all-reduced or all-gathered)");
    }
    fmt::print(
        "model {}-{}-{}-10: {} parameters ({:.1f} MB of gradients per step); batch {} ({} per rank); "
        "overlap {}; compression {}; averaging {}{}\n",
        px, f.hidden, f.hidden, model.parameter_count(), model.parameter_count() * 4 / 1e6, f.batch, f.batch / p,
        f.overlap ? "on" : "off (--no-overlap)", f.compression, averager.spec().to_string(),
        first_epoch ? fmt::format("; resumed after epoch {} from {}", first_epoch, f.resume) : std::string());
  }

  f.monitor.job = "train_mnist";
  // The progress line printed last may have no newline yet: the monitor's lines and hopwise's warnings end it first.
  f.monitor.print_line = [](const std::string& line) {
    hopwise::log::end_console_line();
    fmt::print("{}\n", line);
  };
  hc::Monitor monitor(comm, f.monitor);
  namespace ex = hopwise::examples;
  ex::Trace tr{Clock::now(), {}, rank, !f.trace.empty()};
  const bool tty = isatty(STDOUT_FILENO) != 0;
  const int local = f.batch / p;
  const std::size_t steps_per_epoch = n_train / static_cast<std::size_t>(f.batch);
  std::vector<std::size_t> order(n_train);
  std::vector<float> xb(static_cast<std::size_t>(px) * static_cast<std::size_t>(local));
  std::vector<std::uint8_t> yb(static_cast<std::size_t>(local));
  std::vector<float> probe;        // the ranks' mean model, for the evaluations that leave theirs alone
  double gradient_exposed_ms = 0;  // of exposed_ms: waiting on the reducer (the rest: on the averager)
  double compute_ms = 0, comm_ms = 0, exposed_ms = 0, step_ms = 0, averaging_ms = 0, paused_s = 0;
  std::size_t steps = 0, gradient_bytes = 0;
  ex::Summary sum;
  sum.target_accuracy = f.target;
  std::mt19937_64 shuffle_rng(f.seed + 1);
  auto shuffle = [&] {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), shuffle_rng);  // same permutation on every rank
  };
  for (int e = 0; e < first_epoch; ++e) shuffle();  // where the resumed run's data order stands
  const auto t_start = Clock::now();
  auto training_s = [&] { return std::chrono::duration<double>(Clock::now() - t_start).count() - paused_s; };
  for (int epoch = first_epoch; epoch < f.epochs; ++epoch) {
    shuffle();
    double loss_sum = 0;
    for (std::size_t s = 0; s < steps_per_epoch; ++s) {
      const auto t0 = Clock::now();
      for (int j = 0; j < local; ++j) {  // this rank's slice of the global batch
        const std::size_t idx =
            order[s * static_cast<std::size_t>(f.batch) + static_cast<std::size_t>(rank * local + j)];
        std::memcpy(xb.data() + static_cast<std::size_t>(j) * px, train.images.data() + idx * px, px * sizeof(float));
        yb[static_cast<std::size_t>(j)] = train.labels[idx];
      }
      reducer.set_scope(averager.gradient_scope());
      loss_sum += model.forward(xb.data(), yb.data(), local);
      if (rank == f.straggler) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(f.straggle_ms));
      const auto t_fwd = Clock::now();
      Clock::time_point layer_start;
      model.backward([&](int i) { reducer.mark_ready(i); },
                     [&](int l, bool begin) {
                       if (begin)
                         layer_start = Clock::now();
                       else if (steps < 200)
                         tr.span(fmt::format("backward layer{}", l + 1), "compute", layer_start, Clock::now(), 0);
                     });
      const auto t_bwd = Clock::now();
      const hc::StepStats st = reducer.finish();
      const double waited_before = averager.stats().wait_ms;
      averager.before_step();
      const auto t_opt = Clock::now();
      model.sgd_step(f.lr, f.momentum);
      const auto t_opt_end = Clock::now();
      averager.after_step();
      const auto t1 = Clock::now();
      const double averaged_ms = averager.stats().wait_ms - waited_before;
      if (steps < 200) {
        tr.span("forward", "compute", t0, t_fwd, 0);
        tr.span("finish (exposed comm)", "comm", t_bwd, t1, 0);
        for (const auto& b : reducer.last_timings())
          tr.span(fmt::format("allreduce bucket {} ({:.2f} MB)", b.bucket, b.bytes / 1e6), "comm", b.start, b.end, 1);
      }
      const double step_compute_ms = ms(t_bwd - t0) + ms(t_opt_end - t_opt);  // forward, backward, optimizer step
      if (monitor.on()) {
        hc::StepSample sample{ms(t1 - t0), step_compute_ms, st.exposed_comm_ms + averaged_ms, {}};
        for (const auto& b : reducer.last_timings()) sample.bucket_ms.push_back(ms(b.end - b.start));
        monitor.record(sample);
      }
      compute_ms += step_compute_ms;
      comm_ms += st.comm_ms;
      exposed_ms += st.exposed_comm_ms + averaged_ms;
      gradient_exposed_ms += st.exposed_comm_ms;
      averaging_ms += averaged_ms;
      step_ms += ms(t1 - t0);
      gradient_bytes += st.bytes;
      ++steps;
      // The target's probes: the mean model evaluated off the clock, every rank's own left as it is.
      if (f.target > 0 && sum.seconds_to_target < 0 && steps % static_cast<std::size_t>(f.eval_every) == 0) {
        const auto e0 = Clock::now();
        probe.resize(model.parameter_count());
        averager.average_into(probe.data());
        std::swap_ranges(probe.begin(), probe.end(), model.params());
        const double acc = evaluate(comm, model, test, px);
        std::swap_ranges(probe.begin(), probe.end(), model.params());
        paused_s += std::chrono::duration<double>(Clock::now() - e0).count();
        if (acc >= f.target) {
          sum.seconds_to_target = training_s();
          sum.steps_to_target = steps;
          sum.epochs_to_target = epoch + static_cast<double>(s + 1) / static_cast<double>(steps_per_epoch);
        }
      }
      // A bar redrawn in place on a terminal; a line per quarter epoch in a log.
      const std::size_t every = std::max<std::size_t>(1, steps_per_epoch / (tty ? 40 : 4));
      if (rank == 0 && (s % every == every - 1 || s + 1 == steps_per_epoch)) {
        const int w = 30, done = static_cast<int>(w * (s + 1) / steps_per_epoch);
        fmt::print("{}epoch {}/{} [{}{}] {:3d}% loss {:.3f}", tty ? "\r" : "", epoch + 1, f.epochs,
                   std::string(static_cast<std::size_t>(done), '#'),
                   std::string(static_cast<std::size_t>(w - done), '.'),
                   static_cast<int>(100 * (s + 1) / steps_per_epoch), loss_sum / static_cast<double>(s + 1));
        if (!tty && s + 1 != steps_per_epoch) fmt::print("\n");
        std::fflush(stdout);
        hopwise::log::set_console_line_open(tty || s + 1 == steps_per_epoch);
      }
    }
    // Every epoch ends with one full average (every rank then holds the same model) and an evaluation.
    const auto a0 = Clock::now();
    averager.full_average();
    averaging_ms += ms(Clock::now() - a0);
    const auto e0 = Clock::now();
    const double acc = evaluate(comm, model, test, px);
    paused_s += std::chrono::duration<double>(Clock::now() - e0).count();
    sum.epoch_accuracy.push_back(acc);
    if (f.target > 0 && sum.seconds_to_target < 0 && acc >= f.target) {
      sum.seconds_to_target = training_s();
      sum.steps_to_target = steps;
      sum.epochs_to_target = epoch + 1;
    }
    if (rank == 0) {
      // The epoch's bar ends with its accuracy, unless a warning ended its line already.
      const bool open = hopwise::log::console_line_open();
      hopwise::log::set_console_line_open(false);
      fmt::print("{}test accuracy {:.2f}%\n", open ? " " : "epoch " + std::to_string(epoch + 1) + ": ", 100 * acc);
    }
    if (!f.checkpoint.empty())
      ex::save_checkpoint(comm, f.checkpoint, {epoch + 1, p, averager.save()}, model.params(), model.velocity(),
                          model.parameter_count());
  }
  const double wall_s = std::max(1e-9, training_s());
  const double acc = sum.epoch_accuracy.empty() ? evaluate(comm, model, test, px) : sum.epoch_accuracy.back();
  const double n_steps = std::max<double>(1, static_cast<double>(steps));
  const double overlap_pct = comm_ms > 0 ? std::clamp(100.0 * (1 - gradient_exposed_ms / comm_ms), 0.0, 100.0) : 100.0;
  monitor.finish();
  if (!f.trace.empty()) write_trace(comm, tr, f.trace);
  if (rank == 0) {
    const double avg_bytes = static_cast<double>(averager.stats().bytes) / n_steps;
    fmt::print(
        "test accuracy {:.2f}% after {} epoch(s); {:.0f} images/s; step {:.2f} ms (compute {:.2f} ms: {:.0f}% "
        "utilization; gradient communication {:.2f} ms of which exposed {:.2f} ms: {:.0f}% hidden; waiting on "
        "averaging {:.2f} ms); {:.2f} MB on the wire per step per rank\n",
        100 * acc, f.epochs, static_cast<double>(steps) * f.batch / wall_s, step_ms / n_steps, compute_ms / n_steps,
        step_ms > 0 ? 100 * compute_ms / step_ms : 0.0, comm_ms / n_steps, gradient_exposed_ms / n_steps, overlap_pct,
        averaging_ms / n_steps, (static_cast<double>(gradient_bytes) / n_steps + avg_bytes) / 1e6);
    if (averager.spec().method != "sync")
      fmt::print("averaging {}: {} averagings, {:.2f} MB of parameters per step, {:.2f} ms a step waiting on them\n",
                 averager.spec().to_string(), averager.stats().averages, avg_bytes / 1e6, averaging_ms / n_steps);
    if (f.target > 0)
      std::fputs(
          sum.seconds_to_target >= 0
              ? fmt::format("target accuracy {:.2f}% reached after {} steps ({:.2f} epochs), {:.1f} s of training\n",
                            100 * f.target, sum.steps_to_target, sum.epochs_to_target, sum.seconds_to_target)
                    .c_str()
              : fmt::format("target accuracy {:.2f}% not reached\n", 100 * f.target).c_str(),
          stdout);
    if (!f.trace.empty()) fmt::print("trace written to {} (open in ui.perfetto.dev or chrome://tracing)\n", f.trace);
    const hc::CollectiveStats cs = comm.stats();
    std::string tuned;
    for (const auto& e : comm.tuning().entries)
      if (e.size_class >= 10)  // the gradient buckets' classes, not the job's small bookkeeping calls
        tuned += fmt::format("{}{} B {}", tuned.empty() ? "" : ", ", hc::size_class_max_bytes(e.size_class),
                             hc::to_string(e.choice));
    if (f.tune_bucket)
      fmt::print("bucket cap: {} MB ({}; {} buckets)\n", reducer.bucket_mb(),
                 reducer.tuning_bucket() ? "still tuning: too few steps" : "measured", reducer.bucket_count());
    if (!tuned.empty())
      fmt::print("tuned (size class up to: choice): {}; {} trial calls, {} re-tunes, {:.1f} ms beyond the choices\n",
                 tuned, cs.tuning_trials, cs.retunes, cs.tuning_excess_s * 1e3);
    if (!f.json.empty()) {
      sum.ranks = p;
      sum.epochs = f.epochs;
      sum.batch = f.batch;
      sum.steps = steps;
      sum.test_accuracy = acc;
      sum.train_s = wall_s;
      sum.images_per_s = static_cast<double>(steps) * f.batch / wall_s;
      sum.step_ms = step_ms / n_steps;
      sum.compute_ms = compute_ms / n_steps;
      sum.compute_utilization = step_ms > 0 ? compute_ms / step_ms : 0;
      sum.comm_ms = comm_ms / n_steps;
      sum.exposed_comm_ms = exposed_ms / n_steps;
      sum.averaging_ms = averaging_ms / n_steps;
      sum.overlap_pct = overlap_pct;
      sum.gradient_bytes_per_step = static_cast<double>(gradient_bytes) / n_steps;
      sum.averaging_bytes_per_step = avg_bytes;
      sum.bytes_per_step = sum.gradient_bytes_per_step + avg_bytes;
      sum.compression = f.compression;
      sum.averaging = averager.spec().to_string();
      sum.overlap = f.overlap;
      ex::write_json(f.json, sum);
    }
  }
  return 0;
}

}  // namespace

#ifdef HOPWISE_OPENBLAS
extern "C" void openblas_set_num_threads(int);
#endif

int main(int argc, char** argv) {
#ifdef HOPWISE_OPENBLAS
  // One BLAS thread per rank: the cores are shared with the other ranks and each communicator's progress thread.
  if (!std::getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
#endif
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mnist: %s\n", e.what());
    return 1;
  }
}
