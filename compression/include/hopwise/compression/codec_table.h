// The codec table (compression/src/codec_registry.cpp): a codec is one file in compression/src/codecs/ that defines
// its row (half.cpp: two) and one entry in the table; make_codec, known_codecs(), the parameter defaults and their
// checks all come from it, and the CUDA side dispatches on a row's device hooks. register_codec() adds a row from
// outside the library (tests/test_extension_points.cpp does). C++17: the .cu files include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/compression/codec.h"
#include "hopwise/compression/spec.h"

namespace hopwise::compression::detail {

struct CodecRow;

// How a parameter's text is checked and parsed (the errors say the range; spec_params.h words them).
enum class ParamKind : std::uint8_t {
  kInt,     // an integer in [lo, hi]
  kRatio,   // a number in (0, 1]
  kChoice,  // one of `choices`, written "a|b|c"
};

struct ParamDef {
  const char* name;
  const char* default_value;
  ParamKind kind;
  long long lo;  // kInt: the range [lo, hi]
  long long hi;
  const char* choices;  // kChoice: "nearest|stochastic"
  const char* help;
};

constexpr ParamDef int_param(const char* name, const char* def, long long lo, long long hi, const char* help) {
  return {name, def, ParamKind::kInt, lo, hi, "", help};
}
constexpr ParamDef ratio_param(const char* name, const char* def, const char* help) {
  return {name, def, ParamKind::kRatio, 0, 0, "", help};
}
constexpr ParamDef choice_param(const char* name, const char* def, const char* choices, const char* help) {
  return {name, def, ParamKind::kChoice, 0, 0, choices, help};
}
// "ef" is the one parameter make_codec reads itself: ef=1 wraps the row's codec in error feedback.
constexpr ParamDef ef_param(const char* def) {
  return choice_param("ef", def, "0|1", "error feedback: residual += grad; encode(residual); residual -= decode");
}

// A spec's parameters checked against a row: every parameter of the row, from the spec or its default.
class ParamValues {
 public:
  bool has(std::string_view name) const { return find(name) != nullptr; }
  long long integer(std::string_view name) const;          // kInt
  double ratio(std::string_view name) const;               // kRatio
  const std::string& choice(std::string_view name) const;  // kChoice: the text
  bool flag(std::string_view name) const { return choice(name) == "1"; }
  // The canonical spec string: the name and every parameter, sorted ("topk:ef=1,ratio=0.01").
  const std::string& canonical() const { return canonical_; }

 private:
  struct Value {
    std::string name;
    std::string text;
    long long integer = 0;
    double ratio = 0.0;
  };
  const Value* find(std::string_view name) const;
  const Value& at(std::string_view name) const;
  friend ParamValues check_params(const CodecRow& row, const CodecSpec& spec);
  std::vector<Value> values_;
  std::string canonical_;
};

// What the CUDA side shares with the CPU codec (its kernels are its row in compression/cuda/device_rows.cu, found by
// the spec name; a codec without one is host-only).
struct DeviceHooks {
  std::uint64_t stream_salt;  // the stochastic codecs' rank-stream salt, read by CPU and GPU alike (0: none)
  bool decode_synchronizes;   // decode reads a result back to the host (topk's out-of-range index count)
};

// Builds the codec without error feedback; `name` is its canonical spec string.
using HostFactory = std::unique_ptr<Codec> (*)(const CodecRow& row, std::string name, const ParamValues& v);

struct CodecRow {
  const char* name;        // the spec name
  const ParamDef* params;  // in the order the errors list them ("it takes: ratio, ef") and parse them
  std::size_t param_count;
  Pattern pattern;
  HostFactory make;
  DeviceHooks device;
  // Sends model differences (gossip, async averaging): keeps every element, deterministically, at a bounded
  // relative error; sparsifying and stochastic codecs do not.
  bool for_models;
};

// The table, in the order the errors list the codecs (registered rows last).
std::vector<const CodecRow*> codec_rows();
// Adds `row` (copied; its params and factory must outlive the process's use of it), replacing a row of its name.
// InvalidArgument for a row without a name or factory, or with a name that is not a spec name (letters, digits, _).
void register_codec(const CodecRow& row);
// Null for a name no row has.
const CodecRow* find_codec_row(std::string_view name);
// Throws InvalidArgument for a parameter the row does not take or a value out of range.
ParamValues check_params(const CodecRow& row, const CodecSpec& spec);

// int8's headroom, for the CPU codec and its CUDA kernels alike: the levels q = floor(127 / p) such that p payloads
// of levels in [-q, q] sum within [-127, 127]. InvalidArgument (naming `codec`) above 127 ranks.
int int8_levels(const std::string& codec, int world_size);

}  // namespace hopwise::compression::detail
