// A spec string as a GoogleTest parameter name ("topk:ratio=0.05" -> "topk_ratio_0_05"): the codec suites'
// INSTANTIATE_TEST_SUITE_P name generator.
#pragma once

#include <cctype>
#include <string>

namespace hwtest {

struct SpecTestName {
  template <class Info>
  std::string operator()(const Info& info) const {
    std::string s = info.param;
    for (char& c : s)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return s;
  }
};

}  // namespace hwtest
