// Codec spec strings ("none", "fp16", "int8:block=256,round=stochastic", "topk:ratio=0.01,ef=1"):
// a codec name and its parameters, parsed with errors that name the bad part.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace hopwise::compression {

struct CodecSpec {
  std::string name;
  std::map<std::string, std::string> params;
  std::string to_string() const;  // canonical form: parameters sorted by name
};

// Parses "name[:key=value[,key=value]...]". Throws InvalidArgument on an empty name, a parameter without '=',
// an empty key or value, or a key given twice.
CodecSpec parse_codec_spec(std::string_view text);

}  // namespace hopwise::compression
