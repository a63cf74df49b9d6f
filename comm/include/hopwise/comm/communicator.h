// The communicator: collectives and point-to-point over a Transport (MPI processes, or in-process threads),
// run by the algorithm the cost model (or HOPWISE_ALGO) picks, along the ring order and trees the topology
// planner supplies. Async calls run on one progress thread per communicator, in call order; a sync call runs
// on the caller's thread when nothing is queued (no hand-off latency), else after the queue.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/comm/transport.h"
#include "hopwise/comm/tuning.h"
#include "hopwise/comm/work.h"
#include "hopwise/common/dtype.h"
#include "hopwise/topology/cluster.h"
#include "hopwise/topology/shapes.h"

namespace hopwise::compression {
class Codec;
struct CodecState;
class PowerSgd;
struct PowerSgdState;
}  // namespace hopwise::compression

namespace hopwise::comm {

namespace detail {
struct CommunicatorImpl;  // comm/src/communicator_impl.h
}

struct Options {
  Algorithm algorithm = Algorithm::kAuto;  // HOPWISE_ALGO
  double timeout_s = 300;                  // HOPWISE_TIMEOUT_S: every wait gives up after this
  std::size_t chunk_bytes = 256 << 10;     // HOPWISE_CHUNK_BYTES: pipelining grain and largest message
  bool calibrate = true;                   // HOPWISE_CALIBRATE: fit the cost model at start (else defaults)
  bool check = false;                      // HOPWISE_DEBUG lists CHECK: ranks compare every collective call first
  // HOPWISE_CALL_CHECK (default 1): each collective carries a stamp of the call beside its first message to each
  // peer, so that ranks calling with a different count, dtype, op, root or collective, or skipping a call, fail
  // naming it instead of exchanging wrong data. No extra round trip; 0 turns it off.
  bool stamp_calls = true;
  // HOPWISE_EMULATE_GBPS: emulate a network link of this many Gbit/s (0 = off): every collective lasts at least
  // the time its bytes would take on that wire, the rest spent sleeping (the CPU stays free, as with a NIC).
  double emulate_gbps = 0;
  // HOPWISE_TOPO_DISCOVERY (default 1 through from_env): discover every rank's host at start, gather the views
  // and plan the ring and trees on the job's cluster (collective). HOPWISE_TOPO_FILE replaces discovery with a file.
  bool discover_topology = false;
  // HOPWISE_TUNE (default 1): measure instead of guessing. The first calls of each collective, dtype class and
  // size class try the candidates in turn and every rank then runs the fastest (the slowest rank's time, median
  // of `tune_rounds`, HOPWISE_TUNE_ROUNDS); a drift of the chosen one's time tunes that class again. 0: the cost
  // model alone. The chosen algorithm is the same on every rank.
  // HOPWISE_RING_WINDOW: the ring's sends in flight at most; -1 (default): 1 where the plan spans hosts (a
  // whole block queued at once halved a 2-host ring's speed over TCP), else no limit (within a host a limit costs).
  int ring_window = -1;
  bool tune = true;
  int tune_rounds = 3;
  // HOPWISE_TUNING_FILE: choices measured before (hopwise-tune); classes it lacks are tuned online (when `tune`).
  // A file made for another job shape is ignored with a warning; a malformed one is an error.
  std::string tuning_file;
  static Options from_env();
  // HOPWISE_TIMEOUT_S alone (checked), for the communicators that read no other knob of these.
  static double timeout_from_env();
};

// Where a codec (or PowerSGD) compresses. kWorld: every rank's payload, between every pair of ranks. kNetwork
// ("network:CODEC"): only between hosts: each host sums its ranks' floats over shared memory at full precision, the
// hosts' leaders all-reduce the sums through the codec, and each leader hands the result to its host. On one host
// nothing is compressed; with one rank per host it is the codec over the world.
enum class CompressionScope { kWorld, kNetwork };
// "network:int8" -> {kNetwork, "int8"}; any other spec -> {kWorld, spec}. InvalidArgument for "network:" alone.
std::pair<CompressionScope, std::string> split_compression_scope(const std::string& spec);

// One gradient matrix of a PowerSGD allreduce: rows x cols float32, row-major; `state` is the tensor's own
// (warm start Q, error-feedback residual, step), kept by the caller across steps.
struct PowerSgdTensor {
  const float* in = nullptr;
  float* out = nullptr;  // may equal in
  std::size_t rows = 0, cols = 0;
  compression::PowerSgdState* state = nullptr;
};

struct CollectiveStats {
  std::uint64_t calls = 0;
  std::uint64_t bytes = 0;       // user-buffer bytes passed to collectives on this rank
  std::uint64_t wire_bytes = 0;  // bytes this rank's compressed allreduces put on the wire (payloads + scales)
  double codec_s = 0;            // seconds in codecs: encode, decode, PowerSGD's factor products (this rank)
  // The tuner's: calls that ran a candidate under trial, its agreement calls, size classes tuned again after a
  // drift, and the seconds the trials cost beyond running the chosen algorithm (this rank).
  std::uint64_t tuning_trials = 0, tuning_agreements = 0, retunes = 0;
  double tuning_excess_s = 0;
};

class Communicator {
 public:
  // Over the whole job, as it was launched (launch.h): under mpirun MPI_COMM_WORLD (initializing MPI with
  // MPI_THREAD_MULTIPLE if the caller has not), under torchrun UCX meeting through the TCP store; collective. For
  // another MPI communicator: Communicator(std::make_unique<MpiTransport>(comm), options) (transports/mpi_transport.h).
  explicit Communicator(Options options = Options::from_env());
  // Over any transport (MpiTransport, InProcessTransport, ...). Collective over the transport's ranks.
  Communicator(std::unique_ptr<Transport> transport, Options options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  int host_id() const;
  Transport& transport();

  // ---- collectives (sync); `in` may equal `out` (in place) ----
  void allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op = ReduceOp::kSum);
  // in: size() * recvcount elements; out: recvcount (this rank's block).
  void reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op = ReduceOp::kSum);
  // in: sendcount elements; out: size() * sendcount, rank-major.
  void allgather(const void* in, void* out, std::size_t sendcount, DataType dt);
  void broadcast(void* buf, std::size_t count, DataType dt, int root);
  // out is written at root only (and may be null elsewhere).
  void reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root);
  void barrier();
  void send(const void* buf, std::size_t count, DataType dt, int peer, int tag = 0);
  void recv(void* buf, std::size_t count, DataType dt, int peer, int tag = 0);

  // ---- async: the buffers must stay valid until wait() ----
  Work allreduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op = ReduceOp::kSum);
  Work reduce_scatter_async(const void* in, void* out, std::size_t recvcount, DataType dt,
                            ReduceOp op = ReduceOp::kSum);
  Work allgather_async(const void* in, void* out, std::size_t sendcount, DataType dt);
  Work broadcast_async(void* buf, std::size_t count, DataType dt, int root);
  Work reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root);
  Work barrier_async();
  Work send_async(const void* buf, std::size_t count, DataType dt, int peer, int tag = 0);
  Work recv_async(void* buf, std::size_t count, DataType dt, int peer, int tag = 0);

  // ---- compressed allreduce (float32): the codec's payloads travel instead of the floats ----
  // Aggregatable codecs (fp16, bf16, int8, randomk, none) all-reduce their payloads; gather codecs (topk, sign,
  // qsgd, terngrad) all-gather them; every rank decodes. `state` is the tensor's codec state (error-feedback
  // residual, step), kept by the caller across steps. op: sum or avg. The codec and state must outlive the call.
  // Under CompressionScope::kNetwork only the hosts' leaders encode, and the state's rank and world_size become
  // the leader's among the hosts.
  void allreduce_compressed(const float* in, float* out, std::size_t count, const compression::Codec& codec,
                            compression::CodecState& state, ReduceOp op = ReduceOp::kSum,
                            CompressionScope scope = CompressionScope::kWorld);
  Work allreduce_compressed_async(const float* in, float* out, std::size_t count, const compression::Codec& codec,
                                  compression::CodecState& state, ReduceOp op = ReduceOp::kSum,
                                  CompressionScope scope = CompressionScope::kWorld);

  // ---- compressed reduce-scatter and allgather (float32), for sharded training (FSDP, ZeRO) ----
  // reduce_scatter_compressed: in: size() * recvcount floats; out: this rank's block, the sum (or average) of every
  // rank's block of it. Each rank encodes each block once with its own scales and states[block] (one CodecState per
  // rank's block, kept across calls: error feedback keeps a residual per destination); the payloads go straight to
  // their owners, which decode each in float32 and add them, so no payload is decoded and re-encoded on the way.
  // Every codec of the table fits (the scales travel with each payload). op: sum or avg.
  void reduce_scatter_compressed(const float* in, float* out, std::size_t recvcount, const compression::Codec& codec,
                                 std::span<compression::CodecState> states, ReduceOp op = ReduceOp::kSum);
  Work reduce_scatter_compressed_async(const float* in, float* out, std::size_t recvcount,
                                       const compression::Codec& codec, std::span<compression::CodecState> states,
                                       ReduceOp op = ReduceOp::kSum);
  // allgather_compressed: in: sendcount floats (may be this rank's block of out); out: size() * sendcount, rank-major,
  // every block (this rank's too) as its owner's payload decodes, so every rank holds the same values. `state` is
  // this tensor's (its step; error feedback makes no sense for values that are sent whole each time).
  void allgather_compressed(const float* in, float* out, std::size_t sendcount, const compression::Codec& codec,
                            compression::CodecState& state);
  Work allgather_compressed_async(const float* in, float* out, std::size_t sendcount, const compression::Codec& codec,
                                  compression::CodecState& state);

  // PowerSGD over several matrices at once (a bucket): the P factors of all compressed matrices travel in one
  // float32 allreduce, their Q factors in a second; matrices in warm-up or not worth compressing (1-D, or too
  // small, see PowerSgd::compresses) are all-reduced plainly in one more call. op: sum or avg. The PowerSgd object
  // and every state must outlive the call; every rank passes the same shapes in the same order.
  void allreduce_powersgd(std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                          ReduceOp op = ReduceOp::kSum, CompressionScope scope = CompressionScope::kWorld);
  Work allreduce_powersgd_async(std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                                ReduceOp op = ReduceOp::kSum, CompressionScope scope = CompressionScope::kWorld);

  // ---- within this rank's host only (the plan's hosts; every rank one host where there is no plan) ----
  // Each host all-reduces among its own ranks (a pipelined tree over the host's ranks, never a link between
  // hosts): what hierarchical averaging runs every step. Every rank of the job calls it, in the same order as its
  // other collectives; kAvg divides by the host's rank count. Not link-emulated (HOPWISE_EMULATE_GBPS).
  void allreduce_within_host(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op = ReduceOp::kSum);
  Work allreduce_within_host_async(const void* in, void* out, std::size_t count, DataType dt,
                                   ReduceOp op = ReduceOp::kSum);
  int host_ranks() const;  // the ranks on this rank's host, as the plan places them (size() without a plan)
  // Bytes this rank has sent since it began, by link class: to ranks on its own host (point to point, and into the
  // shared-memory slots) and to other hosts, as the plan places ranks (one host where the transport says all ranks
  // share memory; none under HOPWISE_EMULATE_GBPS, whose link is a network's). MPI's own collectives (algorithm
  // native) count what a bandwidth-optimal algorithm would send, to the next rank: MPI does not say what it sent.
  struct LinkBytes {
    std::uint64_t host = 0, network = 0;
  };
  LinkBytes link_bytes() const;

  // Typed conveniences.
  template <class T>
  void allreduce(std::span<T> buf, ReduceOp op = ReduceOp::kSum) {
    allreduce(buf.data(), buf.data(), buf.size(), dtype_of<T>(), op);
  }

  // ---- plan and algorithm choice ----
  // The planner's ring (a permutation of ranks) and tree(s); rank order and a double binary tree by default.
  // Every rank must set the same plan.
  void set_ring_order(std::vector<int> order);
  void set_trees(topology::TreeShape first, std::optional<topology::TreeShape> second = std::nullopt);
  const std::vector<int>& ring_order() const;
  // Several rings run side by side by large ring allreduces, each on its own part of the buffer ("channels":
  // the plan gives the planned ring and its reverse where no directed link is shared). rings[0] becomes the ring
  // order. ring_channels() is empty while one ring is used.
  void set_ring_channels(std::vector<std::vector<int>> rings);
  const std::vector<std::vector<int>>& ring_channels() const;
  // How the ring and trees were planned (discovery or HOPWISE_TOPO_FILE); empty while they follow rank order.
  const std::string& plan_description() const;
  // The job's cluster as discovery found it (ranks placed on their devices); null when discovery was off.
  const topology::Cluster* cluster() const;
  // The algorithm that will run `c` on `bytes` (resolves auto through the cost model; a forced algorithm that
  // does not implement `c` falls back to the cost model's choice among those that do).
  // With tuning: the tuned choice where the size class is tuned, else the cost model's (what the next call runs
  // may be a candidate under trial).
  Algorithm algorithm_for(Collective c, std::size_t bytes, DataType dt = DataType::kFloat32) const;
  // The tuner's decided choice for the call's class, with its chunk and channels (nullopt: not tuned yet, or
  // tuning off).
  std::optional<TuningChoice> tuned_choice(Collective c, std::size_t bytes, DataType dt = DataType::kFloat32) const;
  // The class's other choices worth a try against the tuned one, best first: the tuner's measured candidates
  // within `within` x the tuned one's time, and the cost model's pick unless it measured slower than that
  // (empty: not tuned). What the reducer's step tuner runs whole steps with.
  std::vector<TuningChoice> tuning_alternatives(Collective c, std::size_t bytes, DataType dt = DataType::kFloat32,
                                                double within = 2.0) const;
  // Every rank at the same point of its calls, like a collective: the class's calls run `choice` from the next one
  // on, as if the tuner had decided it; the tuner goes on watching it for drift. Needs tuning on (HOPWISE_TUNE=1).
  void pin_choice(Collective c, std::size_t bytes, DataType dt, const TuningChoice& choice);
  // What was tuned so far, as a tuning file would keep it (job shape, machine, version, every decided class).
  TuningFile tuning() const;
  bool tunes_online() const;  // HOPWISE_TUNE=1: untuned classes are measured in their first calls
  JobShape job_shape() const;
  // Forces an algorithm for later calls (kAuto returns to the cost model).
  void set_algorithm(Algorithm a);
  const CostModel& cost_model() const;
  CollectiveStats stats() const;

 private:
  void plan_topology(const Options& options);
  void start_tuner(const Options& options);
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace hopwise::comm
