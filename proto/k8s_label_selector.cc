#include "proto/k8s_label_selector.h"

#include <algorithm>

namespace pdr::proto {

namespace {

// Kubernetes' own lexer (apimachinery labels.Lexer) splits on these and on whitespace; every
// other run of bytes is one word.
bool is_special(char c) { return c == '!' || c == '=' || c == '(' || c == ')' || c == ',' || c == '<' || c == '>'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// A label value, or the name part of a key: [A-Za-z0-9] at both ends, [-_.A-Za-z0-9] inside.
bool valid_name(std::string_view s, size_t max) {
  if (s.size() > max) return false;
  if (s.empty()) return true;
  if (!is_alnum(s.front()) || !is_alnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return is_alnum(c) || c == '-' || c == '_' || c == '.'; });
}

// A DNS subdomain (RFC 1123): lower-case labels of [a-z0-9-], joined by dots.
bool valid_prefix(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t dot = s.find('.', start);
    if (dot == std::string_view::npos) dot = s.size();
    std::string_view label = s.substr(start, dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (char c : label) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    }
    start = dot + 1;
  }
  return true;
}

bool valid_key(std::string_view key) {
  const size_t slash = key.find('/');
  std::string_view name = key;
  if (slash != std::string_view::npos) {
    if (!valid_prefix(key.substr(0, slash))) return false;
    name = key.substr(slash + 1);
  }
  return !name.empty() && valid_name(name, 63);
}

enum class Tok : unsigned char { kEnd, kWord, kNot, kEq, kNotEq, kOpen, kClose, kComma, kCompare };

struct Token {
  Tok kind = Tok::kEnd;
  std::string_view text;
  size_t at = 0;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Status parse(std::vector<LabelRequirement>* out) {
    if (peek().kind == Tok::kEnd) return Status::ok();  // empty: every pod
    while (true) {
      LabelRequirement r;
      if (Status st = requirement(&r); !st) return st;
      out->push_back(std::move(r));
      Token t = next();
      if (t.kind == Tok::kEnd) return Status::ok();
      if (t.kind != Tok::kComma) return error(t, "expected ',' or the end");
    }
  }

 private:
  Status error(const Token& t, std::string_view what) const {
    std::string found = t.kind == Tok::kEnd ? std::string("the end") : "'" + std::string(t.text.substr(0, 64)) + "'";
    return Status(StatusCode::kInvalidValue,
                  "label selector at " + std::to_string(t.at) + ": " + std::string(what) + ", found " + found);
  }

  Status key_of(const Token& t, std::string* key) const {
    if (t.kind != Tok::kWord) return error(t, "expected a label key");
    if (!valid_key(t.text)) {
      return error(t, "not a label key ([prefix/]name, name 1-63 of [A-Za-z0-9-_.], alphanumeric at both ends)");
    }
    key->assign(t.text);
    return Status::ok();
  }

  Status value_of(const Token& t, std::string* value) const {
    if (!valid_name(t.text, 63)) {
      return error(t, "not a label value (0-63 of [A-Za-z0-9-_.], alphanumeric at both ends)");
    }
    value->assign(t.text);
    return Status::ok();
  }

  Status requirement(LabelRequirement* r) {
    Token t = next();
    if (t.kind == Tok::kNot) {
      r->op = LabelOp::kNotExists;
      return key_of(next(), &r->key);
    }
    if (Status st = key_of(t, &r->key); !st) return st;
    Token op = peek();
    if (op.kind == Tok::kEnd || op.kind == Tok::kComma) {
      r->op = LabelOp::kExists;
      return Status::ok();
    }
    next();
    if (op.kind == Tok::kEq || op.kind == Tok::kNotEq) {
      r->op = op.kind == Tok::kEq ? LabelOp::kEquals : LabelOp::kNotEquals;
      Token v = peek();
      std::string value;  // `a=` (nothing before ',' or the end) is the empty value
      if (v.kind == Tok::kWord) {
        next();
        if (Status st = value_of(v, &value); !st) return st;
      } else if (v.kind != Tok::kEnd && v.kind != Tok::kComma) {
        return error(v, "expected a label value");
      }
      r->values.push_back(std::move(value));
      return Status::ok();
    }
    if (op.kind == Tok::kWord && (op.text == "in" || op.text == "notin")) {
      r->op = op.text == "in" ? LabelOp::kIn : LabelOp::kNotIn;
      if (Token open = next(); open.kind != Tok::kOpen) return error(open, "expected '('");
      while (true) {
        Token v = next();
        if (v.kind != Tok::kWord) return error(v, "expected a label value in the set");
        std::string value;
        if (Status st = value_of(v, &value); !st) return st;
        r->values.push_back(std::move(value));
        Token sep = next();
        if (sep.kind == Tok::kClose) return Status::ok();
        if (sep.kind != Tok::kComma) return error(sep, "expected ',' or ')'");
      }
    }
    if (op.kind == Tok::kCompare) return error(op, "the comparison operators < and > are not supported");
    return error(op, "expected '=', '==', '!=', 'in', 'notin', ',' or the end");
  }

  Token peek() {
    if (!peeked_) {
      lookahead_ = scan();
      peeked_ = true;
    }
    return lookahead_;
  }
  Token next() {
    Token t = peek();
    peeked_ = false;
    return t;
  }

  Token scan() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
    Token t;
    t.at = pos_;
    if (pos_ >= text_.size()) return t;
    const char c = text_[pos_];
    auto take = [&](Tok kind, size_t n) {
      t.kind = kind;
      t.text = text_.substr(pos_, n);
      pos_ += n;
      return t;
    };
    const bool eq_next = pos_ + 1 < text_.size() && text_[pos_ + 1] == '=';
    switch (c) {
      case '!': return eq_next ? take(Tok::kNotEq, 2) : take(Tok::kNot, 1);
      case '=': return take(Tok::kEq, eq_next ? 2 : 1);
      case '(': return take(Tok::kOpen, 1);
      case ')': return take(Tok::kClose, 1);
      case ',': return take(Tok::kComma, 1);
      case '<':
      case '>': return take(Tok::kCompare, 1);
      default: break;
    }
    size_t end = pos_;
    while (end < text_.size() && !is_space(text_[end]) && !is_special(text_[end])) ++end;
    return take(Tok::kWord, end - pos_);
  }

  std::string_view text_;
  size_t pos_ = 0;
  bool peeked_ = false;
  Token lookahead_;
};

const std::string* find_label(const PodMetadataMap& labels, std::string_view key) {
  for (const auto& [k, v] : labels) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool contains(const std::vector<std::string>& values, const std::string& v) {
  return std::find(values.begin(), values.end(), v) != values.end();
}

}  // namespace

Status parse_label_selector(std::string_view text, LabelSelector* out) {
  if (text.size() > kMaxLabelSelectorBytes) {
    return Status(StatusCode::kTooLarge, "label selector over " + std::to_string(kMaxLabelSelectorBytes) + " bytes");
  }
  LabelSelector selector;
  selector.text.assign(text);
  if (Status st = Parser(text).parse(&selector.requirements); !st) return st;
  *out = std::move(selector);
  return Status::ok();
}

bool label_selector_matches(const LabelSelector& selector, const PodMetadataMap& labels) {
  for (const LabelRequirement& r : selector.requirements) {
    const std::string* value = find_label(labels, r.key);
    bool ok = false;
    switch (r.op) {
      case LabelOp::kExists: ok = value != nullptr; break;
      case LabelOp::kNotExists: ok = value == nullptr; break;
      case LabelOp::kEquals:
      case LabelOp::kIn: ok = value != nullptr && contains(r.values, *value); break;
      case LabelOp::kNotEquals:
      case LabelOp::kNotIn: ok = value == nullptr || !contains(r.values, *value); break;
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace pdr::proto
