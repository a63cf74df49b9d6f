// hopwise-sim: hopwise's algorithms on a simulated cluster (SimGrid), in simulated time: the allreduce table of
// hopwise-bench (time, algorithm and bus bandwidth, the best row per size) for thousands of ranks on a fat tree or
// any SimGrid platform file, with the ranks placed packed or at random and the ring planned or in rank order.
//
//   hopwise-sim --platform fat-tree:hosts=16,ranks-per-host=8,link=25Gbps,oversub=4 -a all -b 4K -e 64M
//   hopwise-sim --platform cluster.xml --ranks 32 --placement random --ring rank
//   hopwise-sim --platform fat-tree:hosts=8,ranks-per-host=8,link=25Gbps,oversub=4 --train gpt2-small --step-ms 40
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <malloc.h>
#include <unistd.h>

#include "hopwise/comm/cost_model.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/sim/rank_collectives.h"
#include "hopwise/topology/planner.h"
#include "platform.h"
#include "train.h"
#include "tune.h"

namespace {

namespace hc = hopwise::comm;
namespace sim = hopwise::comm::sim;
namespace st = hopwise::sim_tool;

struct Options {
  std::string platform;
  int ranks = 0;  // a platform file: ranks over its hosts (default one a host); a fat tree: its ranks-per-host
  st::Placement placement = st::Placement::kPacked;
  std::uint64_t seed = 1;
  bool planned = true;
  std::vector<hc::Algorithm> algos;
  std::size_t begin = 4096, end = 64u << 20, factor = 4;
  std::size_t chunk = 256u << 10;            // the Communicator's default (HOPWISE_CHUNK_BYTES)
  double memory_gib = 8;                     // real buffers: every rank holds its own
  std::vector<std::string> simgrid_options;  // --cfg NAME:VALUE, passed to SimGrid
  std::string buffers = "auto";              // real | phantom | auto (real where they fit in --memory-gib)
  std::string compute = "measured";          // measured | none | REDUCE,COPY (bytes/s, e.g. 5GBps,10GBps)
  bool plan_only = false;                    // print the plan's figures and stop
  bool tuner = false;                        // --tuner: the job's Tuner per size, beside the table
  std::string csv;                           // --csv FILE: the rows as hopwise-bench's CSV (scripts/plot.py reads it)
  st::TrainingOptions train;                 // --train MODEL: the training step instead of the allreduce table
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "hopwise-sim: %s\n"
               "usage: hopwise-sim --platform fat-tree:hosts=H,ranks-per-host=R,link=25Gbps,oversub=O[,leaf=L]"
               "[,latency=1us][,local=20GBps] | --platform FILE.xml [--ranks N]\n"
               "       [--placement packed|cyclic|random] [--seed S] [--ring planned|rank] [-a ALGOS|all]\n"
               "       [-b 4K] [-e 64M] [-f 4] [--chunk 256K] [--memory-gib 8] [--cfg SIMGRID_OPTION:VALUE]...\n"
               "       [--buffers auto|real|phantom] [--compute measured|none|REDUCE,COPY] [--plan-only]\n"
               "       [--csv FILE] [--tuner]\n"
               "       [--train mnist|gpt2-small|LAYERS --step-ms MS [--method SPEC]... [--choose trial|tuner|model]\n"
               "        [--codec-rate 500GBps] [--bucket-mb 25] [--first-bucket-mb 1]]\n"
               "  methods: ddp, sync, sync/CODEC (sync/int8, sync/powersgd:rank=4), local:period=H, hier:period=H,\n"
               "           gossip:peers=K[,codec=C], async:period=H[,delay=D][,codec=C]\n",
               why.c_str());
  std::exit(2);
}

// The element-wise rates of this machine: reduce_into (float32 sum, out of place) and copy_bytes over 64 MiB buffers,
// the best of 3 (memory-bound sizes, as a large collective's chunks stream through memory).
std::pair<double, double> measure_element_rates() {
  const std::size_t n = std::size_t{16} << 20;
  std::vector<float> a(n, 1.0f), b(n, 2.0f), d(n, 0.0f);
  double reduce = 0, copy = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    hopwise::reduce_into(hopwise::DataType::kFloat32, hopwise::ReduceOp::kSum, d.data(), a.data(), b.data(), n);
    auto t1 = std::chrono::steady_clock::now();
    hopwise::copy_bytes(d.data(), a.data(), n * sizeof(float));
    auto t2 = std::chrono::steady_clock::now();
    const double bytes = static_cast<double>(n * sizeof(float));
    reduce = std::max(reduce, bytes / std::chrono::duration<double>(t1 - t0).count());
    copy = std::max(copy, bytes / std::chrono::duration<double>(t2 - t1).count());
  }
  return {reduce, copy};
}

// "5GBps,10GBps" -> bytes/s each (a SimGrid-style rate: B, kB, MB, GB with "ps", or bits with "bps").
std::pair<double, double> parse_rates(const std::string& v) {
  const auto comma = v.find(',');
  if (comma == std::string::npos) usage("--compute takes measured, none or REDUCE,COPY (e.g. 5GBps,10GBps)");
  return {st::parse_rate(v.substr(0, comma)), st::parse_rate(v.substr(comma + 1))};
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--platform")
      o.platform = value();
    else if (a == "--ranks")
      o.ranks = std::atoi(value().c_str());
    else if (a == "--placement") {
      const std::string v = value();
      if (v != "packed" && v != "cyclic" && v != "random") usage("--placement takes packed, cyclic or random");
      o.placement = v == "random"   ? st::Placement::kRandom
                    : v == "cyclic" ? st::Placement::kCyclic
                                    : st::Placement::kPacked;
    } else if (a == "--seed")
      o.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--ring") {
      const std::string v = value();
      if (v != "planned" && v != "rank") usage("--ring takes planned or rank");
      o.planned = v == "planned";
    } else if (a == "-a") {
      const std::string v = value();
      if (v == "all") {
        o.algos.clear();
        for (hc::Algorithm x : sim::sim_algorithms())
          if (hc::implements(x, hc::Collective::kAllreduce)) o.algos.push_back(x);
      } else {
        for (std::size_t at = 0; at <= v.size();) {
          const auto comma = std::min(v.find(',', at), v.size());
          const hc::Algorithm x = hc::parse_algorithm(v.substr(at, comma - at));
          const auto ok = sim::sim_algorithms();
          if (std::find(ok.begin(), ok.end(), x) == ok.end())
            usage(fmt::format("-a {}: {} does not run on simulated ranks (its shared slots or threads)", v,
                              hc::to_string(x)));
          o.algos.push_back(x);
          at = comma + 1;
        }
      }
    } else if (a == "-b")
      o.begin = hopwise::env::parse_size(value(), "-b");
    else if (a == "-e")
      o.end = hopwise::env::parse_size(value(), "-e");
    else if (a == "-f")
      o.factor = hopwise::env::parse_size(value(), "-f");
    else if (a == "--chunk")
      o.chunk = hopwise::env::parse_size(value(), "--chunk");
    else if (a == "--memory-gib")
      o.memory_gib = std::atof(value().c_str());
    else if (a == "--cfg")
      o.simgrid_options.push_back(value());
    else if (a == "--train")
      o.train.model = value();
    else if (a == "--step-ms")
      o.train.step_ms = std::atof(value().c_str());
    else if (a == "--method")
      o.train.methods.push_back(value());
    else if (a == "--choose") {
      o.train.choose = value();
      if (o.train.choose != "trial" && o.train.choose != "tuner" && o.train.choose != "model")
        usage("--choose takes trial, tuner or model");
    } else if (a == "--codec-rate")
      o.train.codec_rate = st::parse_rate(value());
    else if (a == "--bucket-mb")
      o.train.bucket_mb = std::atof(value().c_str());
    else if (a == "--first-bucket-mb")
      o.train.first_bucket_mb = std::atof(value().c_str());
    else if (a == "--plan-only")
      o.plan_only = true;
    else if (a == "--tuner")
      o.tuner = true;
    else if (a == "--csv")
      o.csv = value();
    else if (a == "--buffers") {
      o.buffers = value();
      if (o.buffers != "auto" && o.buffers != "real" && o.buffers != "phantom")
        usage("--buffers takes auto, real or phantom");
    } else if (a == "--compute") {
      o.compute = value();
      if (o.compute != "measured" && o.compute != "none") parse_rates(o.compute);
    } else if (a == "-h" || a == "--help")
      usage("the allreduce table in simulated time");
    else
      usage("unknown argument " + a);
  }
  if (o.platform.empty()) usage("give --platform");
  if (o.algos.empty())
    for (hc::Algorithm x : sim::sim_algorithms())
      if (hc::implements(x, hc::Collective::kAllreduce)) o.algos.push_back(x);
  if (o.factor < 2 || o.begin < 4 || o.end < o.begin) usage("sizes: -b >= 4, -e >= -b, -f >= 2");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    // The platform: a fat tree's XML written to a file, or the user's file as it is.
    std::string xml = o.platform;
    std::optional<st::FatTree> tree;
    std::vector<int> host_of;  // rank -> host index
    if (o.platform.rfind("fat-tree:", 0) == 0) {
      tree = st::parse_fat_tree(o.platform);
      xml = (std::filesystem::temp_directory_path() / fmt::format("hopwise-sim-{}.xml", ::getpid())).string();
      std::ofstream(xml) << st::fat_tree_xml(*tree);
    }
    // Defaults unless given: SimGrid's latency and bandwidth factors at 1 (its own were fitted to TCP on older
    // Ethernet; 1 is what the validation against the emulated cluster found, scripts/sim-validate.py), and no guard
    // page under an actor's stack (each is a memory mapping of its own: 4096 ranks and their connections' actors
    // passed Linux's default limit of 65530 mappings, vm.max_map_count, and SimGrid aborted). Without the guard
    // SimGrid callocs the stacks: a fixed mmap threshold keeps each a fresh mapping whose untouched pages cost
    // nothing (glibc's moving threshold served them from the heap, zeroed: 23 GB for 4096 ranks' tree).
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    for (const char* option : {"network/latency-factor:1", "network/bandwidth-factor:1", "contexts/guard-size:0"}) {
      const std::string name = std::string(option).substr(0, std::string(option).rfind(':'));
      if (std::none_of(o.simgrid_options.begin(), o.simgrid_options.end(),
                       [&](const std::string& c) { return c.rfind(name + ":", 0) == 0; }))
        sim::configure(option);
    }
    for (const std::string& c : o.simgrid_options) sim::configure(c);
    sim::load_platform(xml);
    if (tree) std::filesystem::remove(xml);
    const std::vector<std::string> names = sim::host_names();
    if (tree) {
      host_of = st::place(tree->hosts, tree->ranks_per_host, o.placement, o.seed);
    } else {
      const int n = o.ranks > 0 ? o.ranks : static_cast<int>(names.size());
      const int per = (n + static_cast<int>(names.size()) - 1) / static_cast<int>(names.size());
      host_of = st::place(static_cast<int>(names.size()), per, o.placement, o.seed);
      host_of.resize(static_cast<std::size_t>(n));
    }
    const int n = static_cast<int>(host_of.size());
    std::vector<std::string> hosts;
    for (int h : host_of) hosts.push_back(names[static_cast<std::size_t>(h)]);

    // The ring: the planner's over the platform's hosts (a fat tree's links known), or rank order.
    std::vector<int> ring(static_cast<std::size_t>(n));
    std::iota(ring.begin(), ring.end(), 0);
    double planning_ms = 0;
    int tree_depth = 0;  // the plan's, for the cost model; else as RankCollectives lays the trees
    if (o.planned) {
      const auto t0 = std::chrono::steady_clock::now();
      if (tree) {
        const hopwise::topology::Plan plan = st::plan_on_fat_tree(*tree, host_of);
        ring = plan.ring;
        tree_depth = plan.trees.first.depth();
      } else {  // hosts contiguous in the platform's order: what the planner does where it knows no more
        std::stable_sort(ring.begin(), ring.end(), [&](int a, int b) { return host_of[a] < host_of[b]; });
      }
      planning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }

    const int host_count = static_cast<int>(std::set<int>(host_of.begin(), host_of.end()).size());
    fmt::print("# hopwise-sim: {} ({} hosts in the platform); {} ranks on {} hosts, {} placement, {} ring{}\n",
               o.platform, names.size(), n, host_count,
               o.placement == st::Placement::kRandom   ? "random"
               : o.placement == st::Placement::kCyclic ? "cyclic"
                                                       : "packed",
               o.planned ? "planned" : "rank-order",
               o.planned ? fmt::format(" (planned in {:.1f} ms)", planning_ms) : "");
    if (tree) {  // how often the ring crosses hosts and leaf switches (each leaf's uplinks are shared)
      auto crossings = [&](const std::vector<int>& order, int group) {
        int c = 0;
        for (std::size_t i = 0; i < order.size(); ++i)
          c += host_of[static_cast<std::size_t>(order[i])] / group !=
               host_of[static_cast<std::size_t>(order[(i + 1) % order.size()])] / group;
        return c;
      };
      std::vector<int> rank_order(static_cast<std::size_t>(n));
      std::iota(rank_order.begin(), rank_order.end(), 0);
      fmt::print("# ring hops between hosts: {} (rank order {}); between leaf switches: {} (rank order {})\n",
                 crossings(ring, 1), crossings(rank_order, 1), crossings(ring, tree->leaf),
                 crossings(rank_order, tree->leaf));
    }
    if (o.plan_only) return 0;
    // The element-wise work's simulated time (see RunOptions): this machine's measured rates, none, or given.
    std::pair<double, double> rates{0, 0};
    if (o.compute == "measured")
      rates = measure_element_rates();
    else if (o.compute != "none")
      rates = parse_rates(o.compute);
    fmt::print("# element-wise work: {}; buffers: {}\n",
               rates.first > 0
                   ? fmt::format("reduce {:.2f} GB/s, copy {:.2f} GB/s ({})", rates.first / 1e9, rates.second / 1e9,
                                 o.compute == "measured" ? "measured on this machine" : "given")
                   : std::string("free"),
               !o.train.model.empty() ? std::string("phantom (a training step moves sizes only)")
               : o.buffers == "auto"  ? fmt::format("real where {} ranks' fit in {} GiB, else phantom", n, o.memory_gib)
                                      : o.buffers);
    // auto: the cost model's choice among the simulated rows, with the parameters a job's calibration would find
    // on this platform: alpha a message's latency over the longest route (4 links across leaf switches, 2 within
    // one), beta the inverse of a host's link (the slowest ring neighbours), gamma the measured reduction rate.
    std::optional<hc::CostModel> model;
    if (tree_depth == 0) tree_depth = hopwise::topology::hierarchical_trees(ring, host_of).first.depth();
    tree_depth = std::max(1, tree_depth);
    if (tree) {
      hc::CostParams cp;
      cp.alpha = (tree->hosts > tree->leaf ? 4 : 2) * tree->latency_s;
      cp.beta = 1.0 / tree->link_Bps;
      cp.gamma = rates.first > 0 ? 1.0 / rates.first : 0;
      cp.source = "platform";
      model.emplace(cp);
    }
    st::SimJob job{hosts, ring, host_of, o.chunk, {}, model, host_count, tree_depth};
    job.run.max_held_bytes = static_cast<std::size_t>(o.memory_gib * (1u << 30));
    job.run.reduce_bytes_per_s = rates.first;
    job.run.copy_bytes_per_s = rates.second;
    if (!o.train.model.empty()) {
      std::ofstream csv;
      if (!o.csv.empty()) {
        csv.open(o.csv);
        if (!csv) throw hopwise::InvalidArgument(fmt::format("--csv {}: cannot write it", o.csv));
        csv << "model,ranks,hosts,method,step_ms,compute_ms,utilization,wire_mb,buckets,choose,wall_s\n";
      }
      return st::run_training(o.train, job, csv.is_open() ? &csv : nullptr);
    }
    fmt::print("# allreduce float32 sum, simulated time; busbw = algbw x 2(n-1)/n\n");
    fmt::print("{:>12} {:>10} {:>10} {:>12} {:>9} {:>9} {:>8}\n", "size", "count", "algo", "time(us)", "algbw", "busbw",
               "wall(s)");
    std::map<std::size_t, std::map<std::string, double>> times;  // size -> algorithm -> seconds
    std::set<std::size_t> phantom_sizes;
    std::map<std::size_t, std::pair<std::string, double>> best;
    std::ofstream csv;
    if (!o.csv.empty()) {
      csv.open(o.csv);
      if (!csv) throw hopwise::InvalidArgument(fmt::format("--csv {}: cannot write it", o.csv));
      csv << "size_bytes,count,dtype,op,algo,ranks,time_us,algbw_gbs,busbw_gbs,wall_s,buffers,hosts,planned,"
             "planning_ms,chosen\n";
    }
    for (std::size_t bytes = o.begin; bytes <= o.end; bytes *= o.factor) {
      const std::size_t count = bytes / sizeof(float);
      const double memory = o.memory_gib * (1u << 30);
      const bool fits = static_cast<double>(bytes) * 2.5 * n <= memory;
      if (o.buffers == "real" && !fits) {
        fmt::print("{:>12} {:>10} skipped: {} ranks' real buffers would pass --memory-gib {}\n", bytes, count, n,
                   o.memory_gib);
        continue;
      }
      const bool phantom = o.buffers == "phantom" || (o.buffers == "auto" && !fits);
      if (phantom) phantom_sizes.insert(bytes);
      // Phantom: one buffer for every rank, never written (the work is skipped), so its pages stay unallocated.
      std::unique_ptr<float[]> shared(phantom ? new float[std::max<std::size_t>(count, 1)] : nullptr);
      for (hc::Algorithm a : o.algos) {
        // one_shot gathers every rank's buffer: one gather for the process when phantom (shared scratch), one a
        // rank when real (16 ranks at 64 MiB: 16 GiB, which the real-buffer check above does not count).
        const double gathered = static_cast<double>(bytes) * n * (phantom ? 1 : n);
        if (a == hc::Algorithm::kOneShot && gathered > memory) {
          fmt::print(
              "{:>12} {:>10} {:>10} skipped: its gathers of {} ranks' buffers ({:.1f} GiB) would pass --memory-gib "
              "{}\n",
              bytes, count, hc::to_string(a), n, gathered / (1u << 30), o.memory_gib);
          continue;
        }
        const auto w0 = std::chrono::steady_clock::now();
        bool right = true;
        sim::RunOptions run;
        run.max_held_bytes = static_cast<std::size_t>(memory);
        run.real_payloads = !phantom;
        run.reduce_bytes_per_s = rates.first;
        run.copy_bytes_per_s = rates.second;
        double seconds = 0;
        try {
          seconds = sim::run_ranks(
              hosts,
              [&](int me, hc::Transport& t) {
                hc::sim::RankCollectives coll(t, ring, host_of, o.chunk, phantom);
                if (phantom) {
                  coll.run(a, hc::Collective::kAllreduce, shared.get(), shared.get(), count,
                           hopwise::DataType::kFloat32);
                  return;
                }
                std::vector<float> buf(count, static_cast<float>(me % 3));
                coll.run(a, hc::Collective::kAllreduce, buf.data(), buf.data(), count, hopwise::DataType::kFloat32);
                const float want = static_cast<float>((n / 3) * 3 + (n % 3 == 2 ? 1 : 0));  // sum of r % 3
                if (count > 0 && (buf.front() != want || buf.back() != want)) right = false;
              },
              run);
        } catch (const hopwise::InvalidArgument& e) {  // the messages in flight would pass --memory-gib
          fmt::print("{:>12} {:>10} {:>10} skipped: {}\n", bytes, count, hc::to_string(a), e.what());
          continue;
        }
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
        const double algbw = static_cast<double>(bytes) / seconds / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
        fmt::print("{:>12} {:>10} {:>10} {:>12.1f} {:>9.3f} {:>9.3f} {:>8.2f}{}{}\n", bytes, count, hc::to_string(a),
                   seconds * 1e6, algbw, busbw, wall, phantom ? "  phantom" : "", right ? "" : "  WRONG RESULT");
        if (!right) return 1;
        if (csv.is_open())
          csv << fmt::format("{},{},float32,sum,{},{},{:.3f},{:.6f},{:.6f},{:.3f},{},{},{},{:.3f},\n", bytes, count,
                             hc::to_string(a), n, seconds * 1e6, algbw, busbw, wall, phantom ? "phantom" : "real",
                             host_count, o.planned ? 1 : 0, planning_ms);
        times[bytes][std::string(hc::to_string(a))] = seconds;
        auto& b = best[bytes];
        if (b.first.empty() || seconds < b.second) b = {std::string(hc::to_string(a)), seconds};
      }
    }
    fmt::print("# best per size:");
    for (const auto& [bytes, b] : best) fmt::print(" {}={}", bytes, b.first);
    fmt::print("\n");
    if (model) {
      // auto: the cost model's cheapest estimate among the simulated rows. tuned: the tuner's way, trials of the
      // candidates a job's tuner gets (sim_candidates: its prior's), the fastest kept; simulated time has no noise
      // and each size here is a size class of its own, so only the prior can make it miss the best.
      std::string auto_line, tuned_line, tuner_line;
      double lowest = 1, tuner_lowest = INFINITY;
      auto chosen = [&](const char* label, std::size_t bytes, const std::string& pick, std::string& line,
                        double t = 0) {
        if (t == 0) t = times[bytes].at(pick);
        const double ratio = best[bytes].second / t;
        line += fmt::format(" {}={} ({:.2f})", bytes, pick, ratio);
        if (!csv.is_open()) return ratio;
        const double algbw = static_cast<double>(bytes) / t / 1e9;
        csv << fmt::format("{},{},float32,sum,{},{},{:.3f},{:.6f},{:.6f},0,{},{},{},{:.3f},{}\n", bytes,
                           bytes / sizeof(float), label, n, t * 1e6, algbw, algbw * 2.0 * (n - 1) / n,
                           phantom_sizes.count(bytes) ? "phantom" : "real", host_count, o.planned ? 1 : 0, planning_ms,
                           pick);
        return ratio;
      };
      for (const auto& [bytes, row] : times) {
        hc::CostQuery q;
        q.bytes = bytes;
        q.ranks = n;
        q.hosts = host_count;
        q.tree_depth = tree_depth;
        std::vector<std::pair<std::string, double>> simulated;  // (algorithm, its estimate), the simulated rows
        for (const auto& [a, est] : model->candidates(q, false))
          if (row.count(std::string(hc::to_string(a)))) simulated.emplace_back(hc::to_string(a), est);
        if (simulated.empty()) continue;
        const auto cheapest = std::min_element(simulated.begin(), simulated.end(),
                                               [](const auto& x, const auto& y) { return x.second < y.second; });
        std::string tuned = cheapest->first;
        for (const hc::TuningChoice& c : st::sim_candidates(job, hc::Collective::kAllreduce, bytes)) {
          const std::string a(hc::to_string(c.algorithm));  // a chunk variant is timed as its row
          if (row.count(a) && row.at(a) < row.at(tuned)) tuned = a;
        }
        chosen("auto", bytes, cheapest->first, auto_line);
        lowest = std::min(lowest, chosen("tuned", bytes, tuned, tuned_line));
        if (!o.tuner) continue;
        // The job's Tuner itself: its rounds, pruning and confirmation blocks on every rank, in simulated time; its
        // choice timed as the table's rows are (a chunk variant may beat every row: above 1).
        const std::size_t count = bytes / sizeof(float);
        const sim::TunerRun r = st::tune_class(job, hc::Collective::kAllreduce, hopwise::DataType::kFloat32, count,
                                               phantom_sizes.count(bytes) > 0);
        std::string medians;
        for (const auto& [choice, m] : r.ranked) medians += fmt::format(" {} {:.1f}", hc::to_string(choice), m * 1e6);
        std::string in_a_row;
        for (const auto& [choice, m] : r.in_a_row)
          in_a_row += fmt::format(" {} {:.1f}", hc::to_string(choice), m * 1e6);
        fmt::print(
            "# tuner at {}: lined-up medians (us){}; in a row{}; {} after {} calls, {:.2f} ms of simulated time\n",
            bytes, medians, in_a_row.empty() ? " (no blocks)" : in_a_row, hc::to_string(r.choice), r.calls,
            r.tuning_s * 1e3);
        const std::string pick = hc::to_string(r.choice);
        const double t = row.count(pick) ? row.at(pick)
                                         : st::time_choice(job, hc::Collective::kAllreduce, hopwise::DataType::kFloat32,
                                                           count, r.choice);
        tuner_lowest = std::min(tuner_lowest, chosen("tuner", bytes, pick, tuner_line, t));
      }
      const double gamma = model->params().gamma;
      fmt::print(
          "# auto (the cost model, alpha {:.2f} us, beta 1/{:.2f} GB/s, gamma {}, tree depth {}):{}  (auto/best "
          "in brackets)\n",
          model->params().alpha * 1e6, 1e-9 / model->params().beta,
          gamma > 0 ? fmt::format("1/{:.2f} GB/s", 1e-9 / gamma) : std::string("0"), tree_depth, auto_line);
      fmt::print(
          "# tuned (trials in simulated time among the tuner's candidates, its prior's):{}  "
          "(tuned/best in brackets; lowest {:.2f})\n",
          tuned_line, lowest);
      if (o.tuner)
        fmt::print("# tuner (the job's Tuner, in simulated time):{}  (tuner/best in brackets; lowest {:.2f})\n",
                   tuner_line, tuner_lowest);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hopwise-sim: %s\n", e.what());
    return 1;
  }
}
