// train_mnist's flags (flags.h): the usage text and the parser, which checks every spec before any rank trains.
#include "flags.h"

#include <cstdio>
#include <cstdlib>

#include "hopwise/comm/communicator.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "hopwise/training/averaging.h"

namespace hopwise::examples {

namespace {

namespace hc = hopwise::comm;

constexpr const char* kUsage = R"(usage: mpirun -np N train_mnist [options]
       torchrun --nproc_per_node N --redirects 1 --tee 1 --no_python train_mnist [options]
  --epochs N        passes over the training set (default 5)
  --batch N         global batch, split evenly across ranks (default 128)
  --lr X            learning rate of SGD with momentum 0.9 (default 0.05)
  --hidden N        width of the two hidden layers (default 1024: 784-1024-1024-10)
  --compression S   gradient codec spec, e.g. fp16, int8, topk:ratio=0.01, powersgd:rank=4 (default none /
                    HOPWISE_COMPRESSION); network:SPEC compresses only between hosts (full precision within a host)
  --bucket-mb X     gradient bucket cap in MB (default 1; the first bucket is at most 1 MB); auto: measured in the
                    first steps (caps 1, 2, 4, 8, 25 MB, 5 steps each; the fastest stays)
  --chunks N        hand each weight gradient to the reducer in N column blocks, each as soon as it is computed,
                    so that even the first layer's (the last to finish) overlaps its own computation (default 4)
  --no-overlap      all-reduce only after backward finished (the baseline)
  --algo A          auto, or a row of the algorithm table: ring | hd | tree | one_shot | two_shot | hier | native
  --averaging S     sync (default; HOPWISE_AVERAGING) | local:period=H[,warmup=W] | hier:period=H[,warmup=W] |
                    gossip[:peers=K][,codec=fp16|bf16|int8] | async:period=H[,warmup=W][,delay=D][,codec=C] |
                    diloco:period=H[,outer_lr=LR,momentum=M,nesterov=0|1][,fragments=F][,delay=D][,alpha=A]
                    [,codec=C] (DiLoCo: H local steps, then an outer SGD on the averaged pseudo-gradient; F fragments
                    synced in turn, each behind D steps of compute, any codec; with no outer step named, the one
                    measured for SGD: plain averaging below H = 128, the papers' Nesterov step from there) |
                    diloco:auto[,target=0.95] (period, fragments, delay and codec measured in the first steps to
                    keep the compute utilization at the target, then checked; it prints what it chose and why)
                    (fewer synchronization points; every epoch ends with one full average and a test evaluation)
  --target-accuracy X  evaluate the ranks' mean model every --eval-every steps (off the clock, the ranks' models
                    untouched) until the test accuracy reaches X (e.g. 0.85); report the seconds and epochs to it
  --eval-every N    steps between those evaluations (default 20)
  --checkpoint PATH after each epoch (and every --checkpoint-every steps) every rank writes PATH.step<S>.rank<R>
                    (parameters, momentum, the averaging method's state), torn by no kill: written aside, synced,
                    renamed once every rank's is whole; each rank keeps its two newest
  --checkpoint-every N  also checkpoint every N steps within an epoch (after a full average, as at an epoch's end)
  --resume PATH|auto  start from the newest step every rank holds of PATH (same --averaging, --hidden, --batch and
                    ranks); auto: from --checkpoint's files when there are any, else afresh (for a launcher that
                    restarts the job: torchrun --max-restarts, a requeued batch job)
  --elastic-batch P  under HOPWISE_ELASTIC, after ranks leave or join: keep (default) the global batch, shared by
                    the ranks there are (the course of training barely changes; more compute per rank), or
                    scale-lr: each rank keeps its share and the learning rate follows the ranks (lr x ranks/launched)
  --monitor SPEC    a line per interval on rank 0, e.g. interval=10s[,every=10][,alert_after=3] (HOPWISE_MONITOR)
  --util-alert X    alert when utilization stays below X (0.5 or 50%) for alert_after intervals (HOPWISE_UTIL_ALERT)
  --metrics-file P  Prometheus text file, rewritten atomically each interval (HOPWISE_METRICS_FILE)
  --metrics-json P  JSON lines: every step's per-rank figures, each interval, each alert (HOPWISE_METRICS_JSON)
  --straggle R:MS   rank R sleeps MS ms in every step's compute (a straggler, to see the monitor name it)
  --trace FILE      Chrome/Perfetto trace of compute and bucket communication (HOPWISE_TRACE_FILE)
  --seed N          initialization and shuffling seed (default 1)
  --json FILE       write the summary as JSON
  --limit N         train on the first N images only
  --keep-denormals  leave denormal floats on (by default they are flushed to zero on the threads that compute:
                    a torch run slowed 2x after ~900 steps until they were)
)";

}  // namespace

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw hopwise::InvalidArgument(a + " needs a value; see train_mnist --help");
      return argv[++i];
    };
    auto num = [&](const std::string& v) {
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || d < 0)
        throw hopwise::InvalidArgument(a + " '" + v + "' is not a non-negative number");
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
    else if (a == "--keep-denormals")
      f.keep_denormals = true;  // main() acts on it before any thread starts
    else if (a == "--target-accuracy") {
      f.target = num(val());
      if (f.target > 1) throw hopwise::InvalidArgument("--target-accuracy is a fraction of the test set, e.g. 0.85");
    } else if (a == "--eval-every")
      f.eval_every = static_cast<int>(num(val()));
    else if (a == "--checkpoint")
      f.checkpoint = val();
    else if (a == "--checkpoint-every")
      f.checkpoint_every = static_cast<std::int64_t>(num(val()));
    else if (a == "--elastic-batch") {
      const std::string v = val();
      if (v != "keep" && v != "scale-lr")
        throw hopwise::InvalidArgument("--elastic-batch '" + v + "': use keep (the default) or scale-lr");
      f.elastic_scale_lr = v == "scale-lr";
    } else if (a == "--resume")
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
        throw hopwise::InvalidArgument("--straggle '" + v + "': write RANK:MS, e.g. 1:30 (rank 1 sleeps 30 ms a step)");
      f.straggler = static_cast<int>(num(v.substr(0, colon)));
      f.straggle_ms = num(v.substr(colon + 1));
    } else
      throw hopwise::InvalidArgument("unknown option '" + a + "'; see train_mnist --help");
  }
  if (f.batch < 1 || f.hidden < 1 || f.bucket_mb <= 0 || f.chunks < 1 || f.eval_every < 1)
    throw hopwise::InvalidArgument("--batch, --hidden, --chunks, --eval-every and --bucket-mb must be positive");
  if (f.checkpoint.empty() && (f.checkpoint_every || f.resume == "auto"))
    throw hopwise::InvalidArgument(f.checkpoint_every
                                       ? "--checkpoint-every needs --checkpoint PATH: where to write"
                                       : "--resume auto resumes from --checkpoint PATH's files: give --checkpoint");
  const auto method = hc::AveragingSpec::parse(f.averaging);  // a bad spec fails here, naming the field
  // This trainer's optimizer is SGD with momentum: DiLoCo's outer step follows it where the spec names no family.
  if (method.method == "diloco" && method.inner.empty()) f.averaging += ",inner=sgd";
  if (method.method == "hier" && f.compression != "none")
    throw hopwise::InvalidArgument(
        "--averaging hier averages gradients within each host uncompressed; drop --compression");
  // A bad spec fails here, with the codec's own message.
  if (const auto spec = hopwise::compression::parse_codec_spec(hc::split_compression_scope(f.compression).second);
      spec.name == "powersgd")
    hopwise::compression::PowerSgd::from_spec(spec);
  else if (spec.name != "none")
    hopwise::compression::make_codec(spec);
  return f;
}

}  // namespace hopwise::examples
