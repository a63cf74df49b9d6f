// A small, strict, non-validating XML reader for topology files (internal to topology/).
// No DTD internal subsets, no external entities, no entities beyond the five predefined ones and &#N; / &#xN;.
// Errors are InvalidArgument "<source>:<line>: ...".
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hopwise::topology::detail {

struct XmlElement {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<XmlElement> children;
  std::string text;  // concatenated character data directly inside this element
  int line = 0;

  const std::string* attr(std::string_view key) const {
    for (const auto& [k, v] : attrs)
      if (k == key) return &v;
    return nullptr;
  }
  std::string attr_or(std::string_view key, std::string fallback = {}) const {
    const std::string* v = attr(key);
    return v ? *v : fallback;
  }
};

// Parses one document; `max_depth` limits element nesting.
XmlElement parse_xml(std::string_view text, const std::string& source, int max_depth);

// Throws InvalidArgument "<source>:<line>: <what>".
[[noreturn]] void fail_at(const std::string& source, int line, const std::string& what);

}  // namespace hopwise::topology::detail
