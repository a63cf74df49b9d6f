// The codec table and the parameter checks every row goes through.
#include "codec_registry.h"

#include <iterator>
#include <stdexcept>
#include <utility>

#include "spec_params.h"

namespace hopwise::compression::detail {

// Each defined by its codec's file in codecs/.
extern const CodecRow kNoneRow, kFp16Row, kBf16Row, kInt8Row, kQsgdRow, kTernGradRow, kSignRow, kTopKRow, kRandomKRow;

namespace {

// One entry per codec, in the order the errors list them.
const CodecRow* const kTable[] = {
    &kNoneRow, &kFp16Row, &kBf16Row, &kInt8Row, &kQsgdRow, &kTernGradRow, &kSignRow, &kTopKRow, &kRandomKRow,
};

std::vector<std::string> split_choices(std::string_view text) {
  std::vector<std::string> out;
  for (;;) {
    const auto bar = text.find('|');
    out.emplace_back(text.substr(0, bar));
    if (bar == std::string_view::npos) return out;
    text.remove_prefix(bar + 1);
  }
}

}  // namespace

const std::vector<const CodecRow*>& codec_rows() {
  static const std::vector<const CodecRow*> rows(std::begin(kTable), std::end(kTable));
  return rows;
}

const CodecRow* find_codec_row(std::string_view name) {
  for (const CodecRow* row : codec_rows())
    if (name == row->name) return row;
  return nullptr;
}

ParamValues check_params(const CodecRow& row, const CodecSpec& spec) {
  std::vector<std::pair<std::string, std::string>> defaults;
  for (std::size_t i = 0; i < row.param_count; ++i)
    defaults.emplace_back(row.params[i].name, row.params[i].default_value);
  Params p(spec, std::move(defaults));
  ParamValues v;
  for (std::size_t i = 0; i < row.param_count; ++i) {
    const ParamDef& d = row.params[i];
    ParamValues::Value x;
    x.name = d.name;
    switch (d.kind) {
      case ParamKind::kInt: x.integer = p.get_int(d.name, d.lo, d.hi); break;
      case ParamKind::kRatio: x.ratio = p.get_ratio(d.name); break;
      case ParamKind::kChoice: x.text = p.get_choice(d.name, split_choices(d.choices)); break;
    }
    v.values_.push_back(std::move(x));
  }
  v.canonical_ = p.canonical();
  return v;
}

const ParamValues::Value* ParamValues::find(std::string_view name) const {
  for (const Value& x : values_)
    if (x.name == name) return &x;
  return nullptr;
}

const ParamValues::Value& ParamValues::at(std::string_view name) const {
  if (const Value* x = find(name)) return *x;
  throw std::logic_error("codec registry: no parameter '" + std::string(name) + "' in this row");
}

long long ParamValues::integer(std::string_view name) const { return at(name).integer; }
double ParamValues::ratio(std::string_view name) const { return at(name).ratio; }
const std::string& ParamValues::choice(std::string_view name) const { return at(name).text; }

}  // namespace hopwise::compression::detail
