// The codec table and the parameter checks every row goes through.
#include "hopwise/compression/codec_table.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <deque>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "hopwise/common/error.h"
#include "spec_params.h"

namespace hopwise::compression::detail {

// Each defined by its codec's file in codecs/.
extern const CodecRow kNoneRow, kFp16Row, kBf16Row, kInt8Row, kInt4Row, kFp8Row, kQsgdRow, kTernGradRow, kSignRow,
    kTopKRow, kRandomKRow;

namespace {

// One entry per codec, in the order the errors list them.
const CodecRow* const kTable[] = {
    &kNoneRow, &kFp16Row,     &kBf16Row, &kInt8Row, &kInt4Row,    &kFp8Row,
    &kQsgdRow, &kTernGradRow, &kSignRow, &kTopKRow, &kRandomKRow,
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

namespace {

struct Table {
  std::mutex mutex;
  std::vector<const CodecRow*> rows{std::begin(kTable), std::end(kTable)};
  std::deque<CodecRow> registered;  // their home: a deque keeps each row where it is
};

Table& table() {
  static Table* t = new Table;  // never destroyed: codecs may be made during exit
  return *t;
}

}  // namespace

std::vector<const CodecRow*> codec_rows() {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  return t.rows;
}

const CodecRow* find_codec_row(std::string_view name) {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  for (const CodecRow* row : t.rows)
    if (name == row->name) return row;
  return nullptr;
}

void register_codec(const CodecRow& row) {
  const std::string_view name = row.name ? row.name : "";
  const bool spec_name = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  if (!spec_name || !row.make || (row.param_count && !row.params))
    throw InvalidArgument(fmt::format(
        "register_codec: a row needs a spec name (letters, digits, _; got '{}'), a factory and its parameters", name));
  Table& t = table();
  std::lock_guard lock(t.mutex);
  const CodecRow* home = &t.registered.emplace_back(row);
  for (const CodecRow*& r : t.rows)
    if (name == r->name) {
      r = home;
      return;
    }
  t.rows.push_back(home);
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
