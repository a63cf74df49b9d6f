// The outer rules (outer_rule.h): a table, the first row that fits the family and the period wins.
//
// What they rest on:
// - After SGD with momentum, on the MLP over 5 epochs (docs/results/averaging.md#diloco), the papers' Nesterov step
//   (lr 0.7, momentum 0.9) lost 5.8 points against synchronous training at H = 8 and 1.9-2.3 at H = 32 where plain
//   averaging did not, and it was the best row at H = 128 (+0.44 against DDP); train_mnist at H = 8 (1 epoch) ended
//   at 79.55% with it against 84.72% with plain averaging (2 ranks, 2026-12-07).
// - After AdamW, on the byte-level GPT (docs/results/lm.md), the papers' step stalled at 3.6 bits per byte at H = 32
//   and 64 (3.63 against 3.14 with plain averaging at H = 32).
// - Plain averaging (lr 1, no momentum) is local SGD: it keeps the ranks' mean model and cannot overshoot, so it is
//   the rule for an optimizer nothing here measured.
#include "outer_rule.h"

namespace hopwise::comm::detail {

namespace {

struct Row {
  const char* inner;  // nullptr: any
  int from_period;    // the row holds from this period on
  double lr, momentum;
  bool nesterov;
  const char* why;
};

constexpr Row kRules[] = {
    {"sgd", 128, 0.7, 0.9, true,
     "inner sgd at a long period: the papers' outer Nesterov step (lr 0.7, momentum 0.9), the best measured at H = "
     "128 after SGD"},
    {"sgd", 1, 1.0, 0.0, false,
     "inner sgd at a short period: plain averaging (outer lr 1, no momentum; the outer Nesterov step lost 2-6 points "
     "after SGD-momentum inner steps at H = 8 and 32)"},
    {"adam", 1, 1.0, 0.0, false,
     "inner adam: plain averaging (outer lr 1, no momentum; on the byte-level GPT the papers' outer Nesterov step "
     "stalled at 3.6 bits per byte at H = 32 and 64 where plain averaging went on to 2.9)"},
    {"muon", 1, 1.0, 0.0, false,
     "inner muon: plain averaging (outer lr 1, no momentum), the conservative rule: no outer step after Muon is "
     "measured here yet"},
    {nullptr, 1, 1.0, 0.0, false,
     "inner optimizer not named (inner=sgd|adam|muon): plain averaging (outer lr 1, no momentum), the conservative "
     "rule, which keeps the ranks' mean model and cannot overshoot"},
};

}  // namespace

int momentum_from(const std::string& inner) {
  int from = 0;
  for (const Row& r : kRules)
    if (r.inner != nullptr && inner == r.inner && r.momentum > 0 && (from == 0 || r.from_period < from))
      from = r.from_period;
  return from;
}

const std::vector<std::string>& inner_families() {
  static const std::vector<std::string> names = {"sgd", "adam", "muon"};
  return names;
}

OuterStep outer_rule(const std::string& inner, int period) {
  for (const Row& r : kRules)
    if ((r.inner == nullptr || inner == r.inner) && period >= r.from_period)
      return {r.lr, r.momentum, r.nesterov, r.why};
  return {};  // unreachable: the last row takes every family and period
}

}  // namespace hopwise::comm::detail
