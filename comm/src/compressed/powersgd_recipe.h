// The PowerSGD allreduce of a bucket of matrices, written once for host and device memory: every compressed
// matrix's P = M Q into one buffer and one allreduce, then Q = M^T P^ likewise, then M ~ P^ Q^T; the matrices in
// warm-up or not worth compressing (1-D, small) are all-reduced plainly. Which matrix goes which way is decided
// once, before any of it runs (skip() moves a matrix out of its warm-up, which must not change this step's
// buffers). The Backend, for a matrix type M with rows and cols:
//   bool compressed_step(const M&); bool compresses(const M&); void skip(const M&);
//   std::size_t p_count(const M&), q_count(const M&);
//   void allreduce_plain(const std::vector<const M*>&, ReduceOp op);  // may pack them into one call
//   float* factors(std::size_t floats);                                 // P then Q, grown by the backend
//   void compute_p(const M&, float* p); void compute_q(const float* p, const M&, float* q);
//   void decompress(const float* q, const M&);
//   void allreduce_p(float* p, std::size_t n); void allreduce_q(float* q, std::size_t n, ReduceOp op);
//   void add_wire_bytes(std::size_t b); void finish(std::span<const M>, ReduceOp op);
// op avg is the backend's to apply: P is orthonormalized after its sum, so dividing Q alone averages the product
// (the device does that), or every output is divided at the end (the host, in finish()).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "hopwise/common/dtype.h"

namespace hopwise::comm::compressed {

template <class Backend, class M>
void powersgd_allreduce(Backend& b, std::span<const M> matrices, ReduceOp op) {
  std::vector<const M*> comp, plain;
  std::size_t p_total = 0, q_total = 0, plain_floats = 0;
  for (const M& m : matrices) {
    if (b.compressed_step(m)) {
      comp.push_back(&m);
      p_total += b.p_count(m);
      q_total += b.q_count(m);
    } else {
      plain.push_back(&m);
      plain_floats += m.rows * m.cols;
    }
  }
  if (plain_floats > 0) {
    b.allreduce_plain(plain, op);
    b.add_wire_bytes(plain_floats * sizeof(float));
  }
  for (const M* m : plain)
    if (b.compresses(*m)) b.skip(*m);  // a warm-up step counts
  if (!comp.empty()) {
    float* p = b.factors(p_total + q_total);
    float* q = p + p_total;
    std::size_t pat = 0, qat = 0;
    for (const M* m : comp) {
      b.compute_p(*m, p + pat);
      pat += b.p_count(*m);
    }
    b.allreduce_p(p, p_total);
    pat = 0;
    for (const M* m : comp) {
      b.compute_q(p + pat, *m, q + qat);
      pat += b.p_count(*m);
      qat += b.q_count(*m);
    }
    b.allreduce_q(q, q_total, op);
    qat = 0;
    for (const M* m : comp) {
      b.decompress(q + qat, *m);
      qat += b.q_count(*m);
    }
    b.add_wire_bytes((p_total + q_total) * sizeof(float));
  }
  b.finish(matrices, op);
}

}  // namespace hopwise::comm::compressed
