// Rabenseifner's allreduce: reduce-scatter by recursive halving, allgather by recursive doubling; log2(p)
// rounds each instead of the ring's p-1. For p not a power of two, the first 2*rem ring positions fold in pairs
// (even sends all to odd) before, and unfold after.
#include "algorithms.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm::algo {

namespace {

// Sends [send, send+send_n) to `peer` and receives `recv_n` elements from it into temp, reducing each chunk into
// dst = mine op temp as it arrives.
void exchange_reduce(const Context& c, const char* send, std::size_t send_n, char* dst, const char* mine,
                     std::size_t recv_n, DataType dt, ReduceOp op, int peer, int tag) {
  Transport& t = c.transport;
  const std::size_t es = dtype_size(dt);
  const std::size_t ce = std::max<std::size_t>(1, c.chunk_bytes / es);
  char* temp = static_cast<char*>(c.workspace.get(Scratch::kRecvA, recv_n * es + 64));
  Requests recvs(t), sends(t);
  for (std::size_t j = 0; j < recv_n; j += ce)
    recvs.push_back(t.irecv(temp + j * es, std::min(ce, recv_n - j) * es, peer, tag));
  for (std::size_t j = 0; j < send_n; j += ce)
    sends.push_back(t.isend(send + j * es, std::min(ce, send_n - j) * es, peer, tag));
  std::size_t k = 0;
  for (std::size_t j = 0; j < recv_n; j += ce, ++k) {
    t.wait(recvs[k]);
    const std::size_t n = std::min(ce, recv_n - j);
    reduce_into(dt, op, dst + j * es, mine + j * es, temp + j * es, n);
  }
  t.wait_all(sends);
}

// Sends [send, send+send_n) and receives recv_n elements into recv (both chunked).
void exchange(const Context& c, const char* send, std::size_t send_n, char* recv, std::size_t recv_n, std::size_t es,
              int peer, int tag) {
  Transport& t = c.transport;
  const std::size_t ce = std::max<std::size_t>(1, c.chunk_bytes / es);
  Requests reqs(t);
  for (std::size_t j = 0; j < recv_n; j += ce)
    reqs.push_back(t.irecv(recv + j * es, std::min(ce, recv_n - j) * es, peer, tag));
  for (std::size_t j = 0; j < send_n; j += ce)
    reqs.push_back(t.isend(send + j * es, std::min(ce, send_n - j) * es, peer, tag));
  t.wait_all(reqs);
}

}  // namespace

void halving_doubling_allreduce(const Context& c, const void* in_v, void* out_v, std::size_t count, DataType dt,
                                ReduceOp op, double scale, const std::vector<int>& order) {
  const int p = c.transport.size();
  const int v = position_of(order, c.transport.rank());
  const std::size_t es = dtype_size(dt);
  const char* in = static_cast<const char*>(in_v);
  char* out = static_cast<char*>(out_v);
  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  const int rem = p - pof2;
  auto real_rank = [&](int nv) { return order[static_cast<std::size_t>(nv < rem ? nv * 2 + 1 : nv + rem)]; };
  int tag = kTagHalvingDoubling;

  // Fold: the even position of each of the first rem pairs hands its data to the odd one and sits out.
  int nv = -1;
  if (v < 2 * rem) {
    const int partner = order[static_cast<std::size_t>(v ^ 1)];
    if (v % 2 == 0) {
      exchange(c, in, count, nullptr, 0, es, partner, tag);
    } else {
      exchange_reduce(c, nullptr, 0, out, in, count, dt, op, partner, tag);
      nv = v / 2;
    }
  } else {
    nv = v - rem;
  }
  // The first halving step reads the caller's input directly (no copy of it into out); later steps read out.
  const char* src = (v < 2 * rem) ? out : in;
  ++tag;

  if (nv >= 0) {
    // Recursive halving: keep the half on my side of each split, send the other half to the partner.
    struct Split {
      std::size_t lo, hi;
      bool kept_low;
    };
    std::vector<Split> splits;  // the range before each split and the side kept, for the way back
    std::size_t lo = 0, hi = count;
    for (int mask = pof2 / 2; mask >= 1; mask /= 2, ++tag) {
      const int partner = real_rank(nv ^ mask);
      const std::size_t mid = lo + (hi - lo) / 2;
      const bool keep_low = (nv & mask) == 0;
      splits.push_back({lo, hi, keep_low});
      const std::size_t klo = keep_low ? lo : mid, khi = keep_low ? mid : hi;
      const std::size_t slo = keep_low ? mid : lo, shi = keep_low ? hi : mid;
      exchange_reduce(c, src + slo * es, shi - slo, out + klo * es, src + klo * es, khi - klo, dt, op, partner, tag);
      src = out;
      lo = klo;
      hi = khi;
    }
    if (scale != 1.0) scale_by(dt, out + lo * es, hi - lo, scale);
    // Recursive doubling: swap owned ranges with the same partners in reverse order.
    for (int mask = 1; mask < pof2; mask *= 2, ++tag) {
      const int partner = real_rank(nv ^ mask);
      const auto [plo, phi, kept_low] = splits.back();
      splits.pop_back();
      const std::size_t mid = plo + (phi - plo) / 2;
      const std::size_t olo = kept_low ? mid : plo, ohi = kept_low ? phi : mid;
      exchange(c, out + lo * es, hi - lo, out + olo * es, ohi - olo, es, partner, tag);
      lo = plo;
      hi = phi;
    }
  }

  // Unfold: odd positions hand the result back to the even ones that sat out.
  tag = kTagHalvingDoubling + 1 + 2 * __builtin_ctz(static_cast<unsigned>(pof2));
  if (v < 2 * rem) {
    const int partner = order[static_cast<std::size_t>(v ^ 1)];
    if (v % 2 == 0)
      exchange(c, nullptr, 0, out, count, es, partner, tag);
    else
      exchange(c, out, count, nullptr, 0, es, partner, tag);
  }
}

AlgorithmInfo halving_doubling_row() {
  AlgorithmInfo r;
  r.name = "hd";
  r.one_order = true;
  r.aliases = {"halving-doubling", "rabenseifner"};
  r.collectives = {Collective::kAllreduce};
  r.summary = "Rabenseifner: recursive-halving reduce-scatter, recursive-doubling allgather";
  r.estimate = [](const CostQuery& q) {
    const CostParams& m = *q.params;
    const double n = static_cast<double>(q.bytes), P = q.ranks, frac = (P - 1) / P;
    const double be = beta_for(m, n / P);
    // Over several hosts (ranks packed, the ring's order), the first log2(H) halving steps, (1 - 1/H) of the bytes,
    // pair ranks of different hosts, and every rank of a host sends at once through its NIC: those bytes take
    // ranks-per-host times as long. (The simulated 256 ranks on 32 hosts ran hd at 1/7 of the ring's bandwidth.)
    const double H = std::max(1, q.hosts), per_host = std::max(1.0, P / H);
    const double moved = H > 1 ? (1 - 1 / H) * per_host + (1 / H - 1 / P) : frac;
    double t =
        2 * log2_ceil(q.ranks) * alpha_for(m, std::min(kModelChunk, n / 2)) + 2 * moved * n * be + frac * n * m.gamma;
    const bool pow2 = (q.ranks & (q.ranks - 1)) == 0;
    if (!pow2) t += 2 * alpha_for(m, std::min(kModelChunk, n)) + 2 * n * be + n * m.gamma;  // fold and unfold
    return t;
  };
  r.run = [](AlgorithmContext& a, const CollectiveCall& c) {
    halving_doubling_allreduce(context_of(a), c.in, c.out, c.count, c.dt, c.op, c.scale, a.ring);
  };
  return r;
}

}  // namespace hopwise::comm::algo
