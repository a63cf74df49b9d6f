// The outer step (lr, momentum, Nesterov) that DiLoCo takes where the spec names none, diloco:auto and a fixed
// diloco:period=H alike: by the inner optimizer's family and the period, as measured. Pure.
#pragma once

#include <string>
#include <vector>

namespace hopwise::comm::detail {

struct OuterStep {
  double lr = 1.0;
  double momentum = 0.0;
  bool nesterov = false;
  std::string why;  // one line: the rule and the measurement behind it
};

// The families a spec's inner= names: sgd (SGD, with or without momentum), adam (Adam, AdamW, NAdam, RAdam, Adamax,
// Adagrad: adaptive steps), muon. "" (not named) and any other optimizer take the conservative rule.
const std::vector<std::string>& inner_families();

// The outer step for `inner` at `period`.
OuterStep outer_rule(const std::string& inner, int period);

// The shortest period from which `inner`'s rule takes an outer momentum step (SGD: 128), 0 where it never does.
int momentum_from(const std::string& inner);

}  // namespace hopwise::comm::detail
