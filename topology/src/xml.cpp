#include "xml.h"

#include <fmt/core.h>

#include <cctype>
#include <cstdlib>

#include "hopwise/common/error.h"

namespace hopwise::topology::detail {

void fail_at(const std::string& source, int line, const std::string& what) {
  throw InvalidArgument(fmt::format("{}:{}: {}", source, line, what));
}

namespace {

class Reader {
 public:
  Reader(std::string_view s, const std::string& src, int max_depth) : s_(s), src_(src), max_depth_(max_depth) {}

  XmlElement document() {
    prolog();
    if (at_end() || peek() != '<')
      fail(at_end() ? "expected a root element, found the end of the input"
                    : fmt::format("expected '<' starting the root element, found '{}'", printable(peek())));
    XmlElement root = element(1);
    misc();
    if (!at_end())
      fail(fmt::format("expected the end of the document after </{}>, found '{}'", root.name, printable(peek())));
    return root;
  }

 private:
  std::string_view s_;
  const std::string& src_;
  int max_depth_;
  std::size_t i_ = 0;
  int line_ = 1;

  [[noreturn]] void fail(const std::string& what) const { fail_at(src_, line_, what); }
  bool at_end() const { return i_ >= s_.size(); }
  char peek(std::size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }
  static std::string printable(char c) {
    if (std::isprint(static_cast<unsigned char>(c))) return std::string(1, c);
    return fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  }
  void advance(std::size_t n = 1) {
    for (std::size_t k = 0; k < n && i_ < s_.size(); ++k, ++i_)
      if (s_[i_] == '\n') ++line_;
  }
  bool starts(std::string_view p) const { return s_.substr(i_, p.size()) == p; }
  void skip_ws() {
    while (!at_end() && std::isspace(static_cast<unsigned char>(peek()))) advance();
  }
  void skip_until(std::string_view end, const char* what) {
    const std::size_t pos = s_.find(end, i_);
    if (pos == std::string_view::npos) fail(fmt::format("unterminated {}: expected '{}'", what, end));
    advance(pos + end.size() - i_);
  }
  // Comments, processing instructions, whitespace.
  void misc() {
    for (;;) {
      skip_ws();
      if (starts("<!--"))
        skip_until("-->", "comment");
      else if (starts("<?"))
        skip_until("?>", "processing instruction");
      else
        return;
    }
  }
  void prolog() {
    if (starts("\xEF\xBB\xBF")) advance(3);
    for (;;) {
      misc();
      if (!starts("<!DOCTYPE")) return;
      // A DOCTYPE with an external id is fine (nothing is fetched); an internal subset could declare entities.
      while (!at_end() && peek() != '>') {
        if (peek() == '[') fail("DOCTYPE internal subsets ('[...]') are not accepted; remove the DTD declarations");
        advance();
      }
      if (at_end()) fail("unterminated DOCTYPE: expected '>'");
      advance();
    }
  }
  static bool name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == ':' ||
           (static_cast<unsigned char>(c) >= 0x80);
  }
  std::string name(const char* what) {
    const std::size_t b = i_;
    while (!at_end() && name_char(peek())) advance();
    if (i_ == b)
      fail(fmt::format("expected {} name, found '{}'", what,
                       at_end() ? std::string("end of input") : printable(peek())));
    return std::string(s_.substr(b, i_ - b));
  }
  void decode(std::string_view raw, std::string& out) {
    for (std::size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] != '&') {
        out += raw[k];
        continue;
      }
      const std::size_t semi = raw.find(';', k);
      if (semi == std::string_view::npos || semi - k > 12) fail("expected an entity reference ending in ';' after '&'");
      const std::string_view ent = raw.substr(k + 1, semi - k - 1);
      if (ent == "lt")
        out += '<';
      else if (ent == "gt")
        out += '>';
      else if (ent == "amp")
        out += '&';
      else if (ent == "quot")
        out += '"';
      else if (ent == "apos")
        out += '\'';
      else if (ent.size() > 1 && ent[0] == '#') {
        const bool hex = ent[1] == 'x' || ent[1] == 'X';
        const std::string digits(ent.substr(hex ? 2 : 1));
        char* end = nullptr;
        const unsigned long cp = std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
        if (digits.empty() || *end != '\0' || cp == 0 || cp > 0x10FFFF)
          fail(fmt::format("invalid character reference '&{};'", ent));
        if (cp < 0x80)
          out += static_cast<char>(cp);
        else if (cp < 0x800) {
          out += static_cast<char>(0xC0 | (cp >> 6));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          out += static_cast<char>(0xE0 | (cp >> 12));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          out += static_cast<char>(0xF0 | (cp >> 18));
          out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        }
      } else {
        fail(fmt::format("unknown entity '&{};': only &lt; &gt; &amp; &quot; &apos; and &#N; are accepted", ent));
      }
      k = semi;
    }
  }
  XmlElement element(int depth) {
    if (depth > max_depth_)
      fail(fmt::format("elements nest deeper than the limit of {} levels; expected a flatter document", max_depth_));
    XmlElement e;
    e.line = line_;
    advance();  // '<'
    e.name = name("an element");
    for (;;) {
      skip_ws();
      if (at_end()) fail(fmt::format("unterminated start tag <{}: expected '>' or '/>'", e.name));
      if (peek() == '/') {
        if (peek(1) != '>') fail(fmt::format("expected '/>' closing <{}", e.name));
        advance(2);
        return e;
      }
      if (peek() == '>') {
        advance();
        break;
      }
      std::string key = name("an attribute");
      skip_ws();
      if (peek() != '=') fail(fmt::format("expected '=' after attribute '{}' of <{}>", key, e.name));
      advance();
      skip_ws();
      const char q = peek();
      if (q != '"' && q != '\'') fail(fmt::format("expected a quoted value for attribute '{}' of <{}>", key, e.name));
      advance();
      const std::size_t b = i_;
      while (!at_end() && peek() != q) {
        if (peek() == '<') fail(fmt::format("'<' inside the value of attribute '{}' of <{}>", key, e.name));
        advance();
      }
      if (at_end()) fail(fmt::format("unterminated value of attribute '{}' of <{}>: expected {}", key, e.name, q));
      std::string value;
      decode(s_.substr(b, i_ - b), value);
      advance();
      if (e.attr(key)) fail(fmt::format("attribute '{}' repeated in <{}>", key, e.name));
      e.attrs.emplace_back(std::move(key), std::move(value));
    }
    // Content.
    for (;;) {
      if (at_end())
        fail(fmt::format("unexpected end of input inside <{}> (opened on line {}): expected </{}>", e.name, e.line,
                         e.name));
      if (starts("</")) {
        advance(2);
        const std::string close = name("a closing tag");
        if (close != e.name)
          fail(fmt::format("expected </{}> closing the element opened on line {}, found </{}>", e.name, e.line, close));
        skip_ws();
        if (peek() != '>') fail(fmt::format("expected '>' after </{}", close));
        advance();
        return e;
      }
      if (starts("<!--"))
        skip_until("-->", "comment");
      else if (starts("<![CDATA[")) {
        advance(9);
        const std::size_t b = i_;
        skip_until("]]>", "CDATA section");
        e.text += std::string(s_.substr(b, i_ - 3 - b));
      } else if (starts("<?"))
        skip_until("?>", "processing instruction");
      else if (starts("<!"))
        fail("declarations ('<!') are only accepted before the root element");
      else if (peek() == '<')
        e.children.push_back(element(depth + 1));
      else {
        const std::size_t b = i_;
        while (!at_end() && peek() != '<') advance();
        decode(s_.substr(b, i_ - b), e.text);
      }
    }
  }
};

}  // namespace

XmlElement parse_xml(std::string_view text, const std::string& source, int max_depth) {
  return Reader(text, source, max_depth).document();
}

}  // namespace hopwise::topology::detail
