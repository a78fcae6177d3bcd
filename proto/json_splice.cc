#include "proto/json_splice.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>

namespace pdr::proto {
namespace {

// Strict RFC 8259 scanner: the byte span of each top-level member, and the byte offset of the
// first syntax error, which simdjson's DOM API does not report. It checks the grammar only;
// simdjson also rejects invalid UTF-8, numbers outside its ranges (integers beyond 64 bits,
// floats that overflow to infinity) and unpaired surrogate escapes. Rather than run simdjson on
// every document, the scanner notes anything that could be one of those (needs_simdjson()):
// a number with more than 18 digits or an exponent of 3 digits or more, a \u escape of a
// surrogate (U+D800..U+DFFF) outside a high-low pair, nesting within one level of the limit.
// parse_view runs simdjson only then, when the scan failed (for simdjson's part of the message)
// or when the document is not valid UTF-8; everything else simdjson would accept.
class Scanner {
 public:
  // `known_valid`: the text is a value of a document validated earlier (parse_member_borrowed),
  // so the members' values are skipped by their brackets and quotes, not checked again.
  Scanner(std::string_view text, size_t max_depth, bool known_valid = false)
      : s_(text), max_depth_(max_depth), known_valid_(known_valid) {}

  struct Span {
    size_t key_begin, key_end, value_begin, value_end;
  };

  // Scans the whole document. On success `members` holds the top-level members of the object (or
  // is empty with *is_object == false when the document is valid but not an object).
  bool scan_document(std::vector<Span>* members, size_t* close_brace, bool* is_object) {
    skip_ws();
    *is_object = pos_ < s_.size() && s_[pos_] == '{';
    if (*is_object) {
      if (!object(1, members, close_brace)) return false;
    } else if (!value(0)) {
      return false;
    }
    skip_ws();
    if (pos_ != s_.size()) return fail("unexpected content after the top-level value");
    return true;
  }

  size_t error_pos() const { return error_pos_; }
  const std::string& error() const { return error_; }
  bool depth_error() const { return depth_error_; }
  // After a successful scan: simdjson might reject something the grammar allows (see above).
  bool needs_simdjson() const { return needs_simdjson_ || max_depth_seen_ + 1 >= max_depth_; }

 private:
  bool fail(const char* what) {
    if (error_.empty()) {
      error_ = what;
      error_pos_ = std::min(pos_, s_.size());
    }
    return false;
  }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }

  bool value(size_t depth) {
    if (pos_ >= s_.size()) return fail("unexpected end of input, expected a value");
    switch (s_[pos_]) {
      case '{': return object(depth + 1, nullptr, nullptr);
      case '[': return array(depth + 1);
      case '"': return string();
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default:
        if (s_[pos_] == '-' || (s_[pos_] >= '0' && s_[pos_] <= '9')) return number();
        return fail("expected a value");
    }
  }

  // Skips one value of known-valid JSON: a string by its closing quote, an object or array by
  // its matching bracket (brackets inside strings skipped with the strings), a number or literal
  // up to the next delimiter.
  void skip_valid_value() {
    if (at('"')) {
      string();
      return;
    }
    if (!at('{') && !at('[')) {
      while (pos_ < s_.size() && !is_delimiter(s_[pos_])) ++pos_;
      return;
    }
    size_t depth = 0;
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '"') {
        string();
        continue;
      }
      ++pos_;
      if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        return;
      }
    }
  }
  static bool is_delimiter(char c) {
    return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r';
  }

  bool check_depth(size_t depth) {
    max_depth_seen_ = std::max(max_depth_seen_, depth);
    if (depth > max_depth_) {
      depth_error_ = true;
      return fail("nesting deeper than the depth limit");
    }
    return true;
  }

  bool object(size_t depth, std::vector<Span>* members, size_t* close_brace) {
    if (!check_depth(depth)) return false;
    ++pos_;  // '{'
    skip_ws();
    if (at('}')) {
      if (close_brace) *close_brace = pos_;
      ++pos_;
      return true;
    }
    for (;;) {
      skip_ws();
      if (!at('"')) return fail("expected a string object key");
      Span span{};
      span.key_begin = pos_;
      if (!string()) return false;
      span.key_end = pos_;
      skip_ws();
      if (!at(':')) return fail("expected ':' after object key");
      ++pos_;
      skip_ws();
      span.value_begin = pos_;
      if (known_valid_) {
        skip_valid_value();
      } else if (!value(depth)) {
        return false;
      }
      span.value_end = pos_;
      if (members) members->push_back(span);
      skip_ws();
      if (at(',')) {
        ++pos_;
        continue;
      }
      if (at('}')) {
        if (close_brace) *close_brace = pos_;
        ++pos_;
        return true;
      }
      return fail("expected ',' or '}' after object member");
    }
  }

  bool array(size_t depth) {
    if (!check_depth(depth)) return false;
    ++pos_;  // '['
    skip_ws();
    if (at(']')) {
      ++pos_;
      return true;
    }
    for (;;) {
      skip_ws();
      if (!value(depth)) return false;
      skip_ws();
      if (at(',')) {
        ++pos_;
        continue;
      }
      if (at(']')) {
        ++pos_;
        return true;
      }
      return fail("expected ',' or ']' after array element");
    }
  }

  static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  }
  // The value of the 4 hex digits at `at` (checked by the caller).
  uint32_t hex4_at(size_t at) const {
    uint32_t v = 0;
    for (size_t i = at; i < at + 4; ++i) {
      const char c = s_[i];
      v = (v << 4) | static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  // Moves to the first byte at or after pos_ that is '"', '\\' or a control character, 8 bytes at
  // a time (SWAR: a byte-wise "has zero" test on the word XORed with each special byte; its
  // lowest flagged byte is always a real hit, false positives only occur above one). Stops
  // short of the last 8 bytes, which the table loop in string() handles.
  void skip_plain_string_bytes() {
    static_assert(std::endian::native == std::endian::little, "the first byte of a word is its lowest");
    constexpr uint64_t kOnes = 0x0101010101010101ull;
    constexpr uint64_t kHighs = 0x8080808080808080ull;
    while (pos_ + 8 <= s_.size()) {
      uint64_t v;
      std::memcpy(&v, s_.data() + pos_, 8);
      const uint64_t quote = v ^ (kOnes * '"');
      const uint64_t backslash = v ^ (kOnes * '\\');
      const uint64_t special = (((quote - kOnes) & ~quote) | ((backslash - kOnes) & ~backslash) |
                                ((v - kOnes * 0x20) & ~v)) &  // bytes below 0x20
                               kHighs;
      if (special != 0) {
        pos_ += static_cast<size_t>(__builtin_ctzll(special)) / 8;  // little-endian: first byte
        return;
      }
      pos_ += 8;
    }
  }

  // Bytes a string may hold as they are: not '"', '\\' or a control character.
  static constexpr std::array<bool, 256> kPlainInString = [] {
    std::array<bool, 256> plain{};
    for (int c = 0x20; c < 256; ++c) plain[c] = c != '"' && c != '\\';
    return plain;
  }();

  bool string() {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      // Runs of plain bytes first (most of a body is string content): words, then the tail bytes.
      skip_plain_string_bytes();
      const char* p = s_.data() + pos_;
      const char* const end = s_.data() + s_.size();
      while (p < end && kPlainInString[static_cast<unsigned char>(*p)]) ++p;
      pos_ = static_cast<size_t>(p - s_.data());
      if (pos_ >= s_.size()) break;
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return fail("unescaped control character in string");
      if (c == '\\') {
        ++pos_;
        if (pos_ >= s_.size()) break;
        const char e = s_[pos_];
        if (e == 'u') {
          for (int i = 1; i <= 4; ++i) {
            if (pos_ + i >= s_.size() || !is_hex(s_[pos_ + i])) {
              return fail("invalid \\u escape in string");
            }
          }
          const uint32_t unit = hex4_at(pos_ + 1);
          pos_ += 5;
          // A surrogate (U+D800..U+DFFF): a high one followed by an escaped low one is a pair,
          // which simdjson accepts (and it is skipped here as one); anything else is its call.
          if (unit >= 0xD800 && unit <= 0xDFFF) {
            if (unit <= 0xDBFF && pos_ + 6 <= s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u' &&
                is_hex(s_[pos_ + 2]) && is_hex(s_[pos_ + 3]) && is_hex(s_[pos_ + 4]) &&
                is_hex(s_[pos_ + 5]) && hex4_at(pos_ + 2) >= 0xDC00 && hex4_at(pos_ + 2) <= 0xDFFF) {
              pos_ += 6;
            } else {
              needs_simdjson_ = true;
            }
          }
          continue;
        }
        if (std::strchr("\"\\/bfnrt", e) == nullptr || e == '\0') {
          return fail("invalid escape in string");
        }
      }
      ++pos_;
    }
    return fail("unterminated string");
  }

  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  // Skips digits; their count.
  size_t digits() {
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    return pos_ - start;
  }

  bool number() {
    if (at('-')) ++pos_;
    size_t mantissa_digits = 1;
    if (at('0')) {
      ++pos_;
    } else if ((mantissa_digits = digits()) == 0) {
      return fail("invalid number");
    }
    if (at('.')) {
      ++pos_;
      const size_t fraction_digits = digits();
      if (fraction_digits == 0) return fail("invalid number: digits expected after '.'");
      mantissa_digits += fraction_digits;
    }
    size_t exponent_digits = 0;
    if (at('e') || at('E')) {
      ++pos_;
      if (at('+') || at('-')) ++pos_;
      if ((exponent_digits = digits()) == 0) return fail("invalid number: digits expected in exponent");
    }
    // Up to 18 digits and an exponent of at most 99 in magnitude: an integer within int64 and a
    // finite double, which simdjson accepts. Beyond that simdjson decides (integers beyond 64
    // bits and floats that overflow are errors for it).
    if (mantissa_digits > 18 || exponent_digits > 2) needs_simdjson_ = true;
    return true;
  }

  std::string_view s_;
  size_t max_depth_;
  bool known_valid_ = false;
  size_t pos_ = 0;
  std::string error_;
  size_t error_pos_ = 0;
  bool depth_error_ = false;
  bool needs_simdjson_ = false;
  size_t max_depth_seen_ = 0;
};

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool read_hex4(std::string_view s, size_t at, uint32_t* out) {
  if (at + 4 > s.size()) return false;
  uint32_t v = 0;
  for (size_t i = at; i < at + 4; ++i) {
    const char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
    else return false;
  }
  *out = v;
  return true;
}

std::string_view value_kind(std::string_view raw) {
  if (raw.empty()) return "nothing";
  switch (raw[0]) {
    case '{': return "an object";
    case '[': return "an array";
    case '"': return "a string";
    case 't':
    case 'f': return "a boolean";
    case 'n': return "null";
    default: return "a number";
  }
}

std::string excerpt(std::string_view raw) {
  std::string out(raw.substr(0, 32));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  if (raw.size() > 32) out += "...";
  return out;
}

}  // namespace

bool json_unescape_string(std::string_view lit, std::string* out) {
  out->clear();
  if (lit.size() < 2 || lit.front() != '"' || lit.back() != '"') return false;
  const std::string_view s = lit.substr(1, lit.size() - 2);
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (++i >= s.size()) return false;
    switch (s[i]) {
      case '"': out->push_back('"'); break;
      case '\\': out->push_back('\\'); break;
      case '/': out->push_back('/'); break;
      case 'b': out->push_back('\b'); break;
      case 'f': out->push_back('\f'); break;
      case 'n': out->push_back('\n'); break;
      case 'r': out->push_back('\r'); break;
      case 't': out->push_back('\t'); break;
      case 'u': {
        uint32_t cp = 0;
        if (!read_hex4(s, i + 1, &cp)) return false;
        i += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo = 0;
          if (i + 2 < s.size() && s[i + 1] == '\\' && s[i + 2] == 'u' && read_hex4(s, i + 3, &lo) &&
              lo >= 0xDC00 && lo <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
          } else {
            cp = 0xFFFD;  // lone high surrogate
          }
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          cp = 0xFFFD;  // lone low surrogate
        }
        append_utf8(cp, out);
        break;
      }
      default: return false;
    }
  }
  return true;
}

namespace {
thread_local uint64_t parses_on_this_thread = 0;
thread_local uint64_t simdjson_runs_on_this_thread = 0;
thread_local bool simdjson_on_every_parse = false;
}  // namespace

uint64_t json_object_parses() { return parses_on_this_thread; }
uint64_t json_simdjson_runs() { return simdjson_runs_on_this_thread; }
void set_json_simdjson_on_every_parse(bool on) { simdjson_on_every_parse = on; }

Status JsonObjectBody::parse(std::string_view text, const JsonLimits& limits, JsonObjectBody* out) {
  Status st = parse_view(text, limits, Validation::kFull, out);
  if (st.is_ok()) {
    out->owner_ = std::make_shared<const std::string>(text);
    out->doc_ = *out->owner_;
  }
  return st;
}

Status JsonObjectBody::parse_owned(std::string&& text, const JsonLimits& limits, JsonObjectBody* out) {
  Status st = parse_view(text, limits, Validation::kFull, out);
  if (st.is_ok()) {
    out->owner_ = std::make_shared<const std::string>(std::move(text));
    out->doc_ = *out->owner_;
  }
  return st;
}

Status JsonObjectBody::parse_borrowed(std::string_view text, const JsonLimits& limits, JsonObjectBody* out) {
  Status st = parse_view(text, limits, Validation::kFull, out);
  if (st.is_ok()) out->doc_ = text;
  return st;
}

Status JsonObjectBody::parse_member_borrowed(std::string_view raw_value, const JsonLimits& limits,
                                             JsonObjectBody* out) {
  Status st = parse_view(raw_value, limits, Validation::kInsideValidated, out);
  if (st.is_ok()) out->doc_ = raw_value;
  return st;
}

namespace {

// Set when the thread's spares are destroyed (thread exit): a body destroyed later on that thread
// (held by another thread_local or static object) frees its storage as usual.
thread_local bool body_spares_gone = false;

// Tables kept for usual bodies only: one with very many members does not pin its storage.
constexpr size_t kKeptMembers = 64, kKeptEditBytes = 4096;
constexpr size_t kInlineEditBytes = 15;  // std::string's inline buffer (no storage of its own)

}  // namespace

// Emptied tables of destroyed bodies, per thread. A request makes and drops the same few bodies
// (the client's, a copy per leg, their edits), each a member table and an edits buffer: reused,
// they cost no allocation per request once warm. Bounded: beyond the caps storage is freed as
// usual.
struct JsonObjectBody::Spares {
  static constexpr size_t kMaxEach = 256;
  ~Spares() { body_spares_gone = true; }
  std::vector<std::vector<Member>> members;
  std::vector<std::string> edits;
};

JsonObjectBody::Spares* JsonObjectBody::spares() {
  if (body_spares_gone) return nullptr;
  thread_local Spares spares;
  return &spares;
}

JsonObjectBody::~JsonObjectBody() {
  const bool members = members_.capacity() != 0 && members_.capacity() <= kKeptMembers;
  const bool edits = edits_.capacity() > kInlineEditBytes && edits_.capacity() <= kKeptEditBytes;
  if (!members && !edits) return;
  Spares* s = spares();
  if (s == nullptr) return;
  if (members && s->members.size() < Spares::kMaxEach) {
    members_.clear();
    s->members.push_back(std::move(members_));
  }
  if (edits && s->edits.size() < Spares::kMaxEach) {
    edits_.clear();
    s->edits.push_back(std::move(edits_));
  }
}

void JsonObjectBody::take_spare_members() {
  if (members_.capacity() != 0) return;
  Spares* s = spares();
  if (s == nullptr || s->members.empty()) return;
  members_ = std::move(s->members.back());
  s->members.pop_back();
}

void JsonObjectBody::take_spare_edits() {
  if (edits_.capacity() > kInlineEditBytes) return;
  Spares* s = spares();
  if (s == nullptr || s->edits.empty()) return;
  edits_ = std::move(s->edits.back());
  s->edits.pop_back();
}

JsonObjectBody::JsonObjectBody(const JsonObjectBody& other)
    : owner_(other.owner_),
      doc_(other.doc_),
      close_brace_(other.close_brace_),
      original_count_(other.original_count_) {
  if (!other.edits_.empty()) {
    take_spare_edits();
    edits_.assign(other.edits_);
  }
  // A copy is made to be edited (a leg from the client's body): room for its appends at once.
  take_spare_members();
  members_.reserve(other.members_.size() + kAppendRoom);
  members_.insert(members_.end(), other.members_.begin(), other.members_.end());
}

JsonObjectBody& JsonObjectBody::operator=(const JsonObjectBody& other) {
  if (this != &other) *this = JsonObjectBody(other);
  return *this;
}

JsonObjectBody& JsonObjectBody::operator=(JsonObjectBody&& other) noexcept {
  if (this == &other) return *this;
  if (members_.capacity() != 0 || edits_.capacity() > kInlineEditBytes) {
    // This body's storage goes to the spares (a session drops its legs by assigning empty ones).
    JsonObjectBody dropped;
    dropped.members_.swap(members_);
    dropped.edits_.swap(edits_);
  }
  owner_ = std::move(other.owner_);
  doc_ = std::exchange(other.doc_, std::string_view());
  close_brace_ = std::exchange(other.close_brace_, 0);
  original_count_ = std::exchange(other.original_count_, 0);
  members_ = std::move(other.members_);
  other.members_.clear();
  edits_ = std::move(other.edits_);
  other.edits_.clear();
  return *this;
}

void JsonObjectBody::clear() {
  owner_.reset();
  doc_ = std::string_view();
  close_brace_ = 0;
  original_count_ = 0;
  // Capacity is kept for usual bodies only: one with very many members does not pin its table.
  if (members_.capacity() > kKeptMembers) std::vector<Member>().swap(members_);
  if (edits_.capacity() > kKeptEditBytes) std::string().swap(edits_);
  members_.clear();
  edits_.clear();
}

std::string_view JsonObjectBody::original_key(std::string_view doc, const Member& m) {
  if (m.key_escaped) return m.unescaped_key;
  return doc.substr(m.key_begin + 1, m.key_end - m.key_begin - 2);
}

std::string_view JsonObjectBody::key_of(const Member& m) const {
  return m.appended ? edit(m.key_begin, m.key_end - m.key_begin) : original_key(doc_, m);
}

namespace {

struct KeyAt {
  std::string_view key;
  size_t at;  // offset of the key's opening quote
};

// Empties a per-thread scratch vector of parse_view, keeping its capacity unless a body with
// very many members grew it (then it is freed: held only until the next parse on the thread).
template <typename T>
void reset_scratch(std::vector<T>& v) {
  constexpr size_t kKeptCapacity = 1024;
  if (v.capacity() > kKeptCapacity) std::vector<T>().swap(v);
  v.clear();
}

// The duplicate key parse() reports: the smallest duplicated key (byte order), at its second
// occurrence. `keys` is in document order.
std::optional<KeyAt> first_duplicate(std::span<const KeyAt> keys) {
  std::optional<KeyAt> found;
  // Pairwise below this size: no allocation for the usual few-member body.
  constexpr size_t kPairwiseUpTo = 64;
  if (keys.size() <= kPairwiseUpTo) {
    for (size_t j = 1; j < keys.size(); ++j) {
      if (found && keys[j].key >= found->key) continue;
      for (size_t i = 0; i < j; ++i) {
        if (keys[i].key == keys[j].key) {
          found = keys[j];  // j is the key's second occurrence: any earlier j would have matched
          break;
        }
      }
    }
    return found;
  }
  std::vector<std::pair<std::string_view, size_t>> sorted;
  sorted.reserve(keys.size());
  for (const KeyAt& k : keys) sorted.emplace_back(k.key, k.at);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].first == sorted[i - 1].first) return KeyAt{sorted[i].first, sorted[i].second};
  }
  return std::nullopt;
}

}  // namespace

// Validates and indexes `text`; the caller attaches the document (doc_, owner_) on success.
// kInsideValidated: `text` is a value of a document parse_view validated (kFull) earlier, so it is
// valid JSON within the limits: only scanned for its members.
Status JsonObjectBody::parse_view(std::string_view text, const JsonLimits& limits, Validation validation,
                                  JsonObjectBody* out) {
  ++parses_on_this_thread;
  out->clear();
  if (text.size() > limits.max_bytes) {
    return Status(StatusCode::kTooLarge, "JSON body of " + std::to_string(text.size()) +
                                             " bytes exceeds the limit of " +
                                             std::to_string(limits.max_bytes) + " bytes");
  }
  Scanner scanner(text, limits.max_depth, validation == Validation::kInsideValidated);
  // Scratch reused per thread (like the simdjson parser below): no allocation per parse.
  thread_local std::vector<Scanner::Span> spans;
  reset_scratch(spans);
  size_t close_brace = 0;
  bool is_object = false;
  const bool scanned = scanner.scan_document(&spans, &close_brace, &is_object);

  // simdjson runs when its verdict could differ from the scanner's or its message is needed (the
  // Scanner's comment): the outcome and every message are those of running both on every document.
  const bool run_simdjson =
      validation == Validation::kFull &&
      (!scanned || scanner.needs_simdjson() || simdjson_on_every_parse ||
       !simdjson::validate_utf8(text.data(), text.size()));
  simdjson::error_code err = simdjson::SUCCESS;
  if (run_simdjson) {
    ++simdjson_runs_on_this_thread;
    // simdjson gets one more level than our limit so that our scanner, which reports an offset,
    // is the one that trips on depth; simdjson still validates UTF-8, number ranges and the rest.
    // One parser per thread, reused: allocating its buffers per request would cost more than the
    // parse itself on typical bodies. It grows to the largest body seen (bounded by max_bytes).
    thread_local simdjson::dom::parser parser;
    if (parser.capacity() < text.size() || parser.max_depth() != limits.max_depth + 1) {
      err = parser.allocate(std::max<size_t>(text.size(), 4096), limits.max_depth + 1);
    }
    if (err == simdjson::SUCCESS) {
      err = parser.parse(text.data(), text.size(), /*realloc_if_needed=*/true).error();
    }
  }
  if (!scanned) {
    const std::string where = "at byte " + std::to_string(scanner.error_pos()) + ": ";
    if (scanner.depth_error() || err == simdjson::DEPTH_ERROR) {
      return Status(StatusCode::kTooDeep, "JSON nesting " + where + "deeper than " +
                                              std::to_string(limits.max_depth) + " levels");
    }
    std::string msg = "invalid JSON " + where + scanner.error();
    if (err != simdjson::SUCCESS) msg += std::string(" (simdjson: ") + simdjson::error_message(err) + ")";
    return Status(StatusCode::kMalformed, msg);
  }
  if (err == simdjson::DEPTH_ERROR) {
    return Status(StatusCode::kTooDeep,
                  "JSON nesting deeper than " + std::to_string(limits.max_depth) + " levels");
  }
  if (err != simdjson::SUCCESS) {
    // Syntax was fine, so this is UTF-8, a number out of range, or similar.
    return Status(StatusCode::kMalformed,
                  std::string("invalid JSON: ") + simdjson::error_message(err));
  }
  if (!is_object) {
    const std::string_view trimmed =
        text.substr(std::min(text.find_first_not_of(" \t\r\n"), text.size()));
    return Status(StatusCode::kWrongType,
                  "JSON body must be an object, got " + std::string(value_kind(trimmed)));
  }

  out->close_brace_ = close_brace;
  out->original_count_ = spans.size();
  out->take_spare_members();
  out->members_.resize(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    const Scanner::Span& span = spans[i];
    Member& m = out->members_[i];
    m.key_begin = span.key_begin;
    m.key_end = span.key_end;
    m.value_begin = span.value_begin;
    m.value_end = span.value_end;
    // Keys are views into the document; only one spelled with escapes is unescaped (and kept).
    const std::string_view literal = text.substr(span.key_begin, span.key_end - span.key_begin);
    if (literal.find('\\') == std::string_view::npos) continue;
    m.key_escaped = true;
    if (!json_unescape_string(literal, &m.unescaped_key)) {
      out->clear();
      return Status(StatusCode::kMalformed,
                    "invalid JSON at byte " + std::to_string(span.key_begin) + ": bad object key");
    }
  }
  thread_local std::vector<KeyAt> keys;
  reset_scratch(keys);
  for (const Member& m : out->members_) keys.push_back(KeyAt{original_key(text, m), m.key_begin});
  if (const auto dup = first_duplicate(keys)) {
    Status st(StatusCode::kInvalidValue,
              "duplicate top-level key \"" + excerpt(dup->key) + "\" at byte " + std::to_string(dup->at) +
                  " (ambiguous: parsers disagree on which one wins)");
    out->clear();
    return st;
  }
  return Status::ok();
}

JsonObjectBody::Member* JsonObjectBody::find_member(std::string_view key) {
  return const_cast<Member*>(std::as_const(*this).find_member(key));
}

const JsonObjectBody::Member* JsonObjectBody::find_member(std::string_view key) const {
  // Called for every field the router reads or edits: the usual member (an original key without
  // escapes) is compared where it lies, by its length first, without building its view.
  const char* const doc = doc_.data();
  for (const Member& m : members_) {
    if (m.removed) continue;
    if (!m.appended && !m.key_escaped) {
      if (m.key_end - m.key_begin - 2 == key.size() &&
          std::memcmp(doc + m.key_begin + 1, key.data(), key.size()) == 0) {
        return &m;
      }
      continue;
    }
    if (key_of(m) == key) return &m;
  }
  return nullptr;
}

std::optional<std::string_view> JsonObjectBody::get_raw(std::string_view key) const {
  if (const Member* m = find_member(key)) {
    if (m->replaced) return edit(m->edit_begin, m->edit_size);
    return original().substr(m->value_begin, m->value_end - m->value_begin);
  }
  return std::nullopt;
}

bool JsonObjectBody::is_null(std::string_view key) const {
  const auto raw = get_raw(key);
  return raw && *raw == "null";
}

Status JsonObjectBody::get_int(std::string_view key, std::optional<int64_t>* out) const {
  out->reset();
  const auto raw = get_raw(key);
  if (!raw) return Status::ok();
  const std::string_view r = *raw;
  const bool numeric = !r.empty() && (r[0] == '-' || (r[0] >= '0' && r[0] <= '9'));
  if (!numeric || r.find_first_of(".eE") != std::string_view::npos) {
    return Status(StatusCode::kWrongType, std::string(key) + " must be an integer, got " +
                                              (numeric ? excerpt(r) : std::string(value_kind(r))));
  }
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(r.data(), r.data() + r.size(), v);
  if (ec == std::errc::result_out_of_range) {
    return Status(StatusCode::kOutOfRange, std::string(key) + " " + excerpt(r) +
                                               " is outside the 64-bit integer range");
  }
  if (ec != std::errc() || ptr != r.data() + r.size()) {
    return Status(StatusCode::kWrongType, std::string(key) + " must be an integer, got " + excerpt(r));
  }
  *out = v;
  return Status::ok();
}

Status JsonObjectBody::get_bool(std::string_view key, std::optional<bool>* out) const {
  out->reset();
  const auto raw = get_raw(key);
  if (!raw) return Status::ok();
  if (*raw == "true") *out = true;
  else if (*raw == "false") *out = false;
  else {
    return Status(StatusCode::kWrongType,
                  std::string(key) + " must be a boolean, got " + std::string(value_kind(*raw)));
  }
  return Status::ok();
}

Status JsonObjectBody::get_string(std::string_view key, std::optional<std::string>* out) const {
  out->reset();
  const auto raw = get_raw(key);
  if (!raw) return Status::ok();
  std::string s;
  if (raw->empty() || raw->front() != '"' || !json_unescape_string(*raw, &s)) {
    return Status(StatusCode::kWrongType,
                  std::string(key) + " must be a string, got " + std::string(value_kind(*raw)));
  }
  *out = std::move(s);
  return Status::ok();
}

size_t JsonObjectBody::add_edit(std::string_view bytes) {
  const size_t at = edits_.size();
  const std::less<const char*> before;
  const bool ours = !bytes.empty() && !before(bytes.data(), edits_.data()) && before(bytes.data(), edits_.data() + at);
  const size_t from = ours ? static_cast<size_t>(bytes.data() - edits_.data()) : 0;  // before it may move
  // A leg's edits take a few hundred bytes: one allocation instead of several doublings.
  if (at == 0) take_spare_edits();
  if (edits_.capacity() < at + bytes.size()) edits_.reserve(std::max<size_t>(256, 2 * (at + bytes.size())));
  if (ours) {
    edits_.append(edits_, from, bytes.size());  // a value of this body (get_raw of an edited key)
  } else {
    edits_.append(bytes);
  }
  return at;
}

void JsonObjectBody::set_raw(std::string_view key, std::string_view raw_json_value) {
  if (Member* m = find_member(key)) {
    m->edit_begin = add_edit(raw_json_value);
    m->edit_size = raw_json_value.size();
    m->replaced = true;
    return;
  }
  if (members_.capacity() == 0) take_spare_members();
  if (members_.size() == members_.capacity()) members_.reserve(members_.size() + kAppendRoom);
  Member& m = members_.emplace_back();
  m.appended = true;
  m.replaced = true;
  m.edit_begin = add_edit(raw_json_value);  // first: it may be a view into edits_ (the key is not)
  m.edit_size = raw_json_value.size();
  m.key_begin = add_edit(key);
  m.key_end = m.key_begin + key.size();
}

// An appended member removed stays as a removed entry: set again, it is appended anew (last).
void JsonObjectBody::remove(std::string_view key) {
  if (Member* m = find_member(key)) m->removed = true;
}

size_t JsonObjectBody::size() const {
  size_t n = 0;
  for (const Member& m : members_) n += m.removed ? 0 : 1;
  return n;
}

// Calls append(piece) for each piece of the rendered document, in order.
template <typename Append>
void JsonObjectBody::emit(Append&& append) const {
  const std::string_view t = original();
  if (t.empty()) return;
  // "{" plus whatever whitespace precedes the first member (or the closing brace).
  const size_t head_end = original_count_ == 0 ? close_brace_ : members_.front().key_begin;
  append(t.substr(0, head_end));
  bool any = false;
  for (size_t i = 0; i < original_count_; ++i) {
    const Member& m = members_[i];
    if (m.removed) continue;
    // Each member after the first owns the separator before it (", " and original whitespace);
    // the first surviving member drops it, so removal never leaves a stray comma.
    if (any) append(t.substr(members_[i - 1].value_end, m.key_begin - members_[i - 1].value_end));
    if (m.replaced) {
      append(t.substr(m.key_begin, m.value_begin - m.key_begin));
      append(edit(m.edit_begin, m.edit_size));
    } else {
      append(t.substr(m.key_begin, m.value_end - m.key_begin));
    }
    any = true;
  }
  // Whitespace between the last original member and '}' stays where it was.
  if (original_count_ > 0) {
    const size_t tail = members_[original_count_ - 1].value_end;
    append(t.substr(tail, close_brace_ - tail));
  }
  for (size_t i = original_count_; i < members_.size(); ++i) {
    const Member& m = members_[i];
    if (m.removed) continue;
    if (any) append(std::string_view(","));
    const std::string_view k = key_of(m);
    const bool plain = std::none_of(k.begin(), k.end(), [](char ch) {
      const auto c = static_cast<unsigned char>(ch);
      return c < 0x20 || c == 0x7f || c == '"' || c == '\\';
    });
    if (plain) {  // the usual case (the builders' own keys): no escaped copy of the key
      append(std::string_view("\""));
      append(k);
      append(std::string_view("\":"));
    } else {
      const std::string key = json_string(k);
      append(std::string_view(key));
      append(std::string_view(":"));
    }
    append(edit(m.edit_begin, m.edit_size));
    any = true;
  }
  append(t.substr(close_brace_));
}

std::string JsonObjectBody::render() const {
  std::string out;
  out.reserve(rendered_size());
  render_into(&out);
  return out;
}

void JsonObjectBody::render_into(std::string* out) const {
  emit([out](std::string_view piece) { out->append(piece); });
}

size_t JsonObjectBody::rendered_size() const {
  size_t n = 0;
  emit([&n](std::string_view piece) { n += piece.size(); });
  return n;
}

namespace {

// Length of the longest prefix of `s` whose bytes the string builder copies as they are: not
// '"', '\\', a control character or DEL. 8 bytes at a time (the SWAR test of the Scanner's
// skip_plain_string_bytes, plus DEL), then byte by byte.
size_t unescaped_prefix(std::string_view s) {
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  constexpr uint64_t kHighs = 0x8080808080808080ull;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    const uint64_t quote = v ^ (kOnes * '"');
    const uint64_t backslash = v ^ (kOnes * '\\');
    const uint64_t del = v ^ (kOnes * 0x7f);
    const uint64_t special = (((quote - kOnes) & ~quote) | ((backslash - kOnes) & ~backslash) |
                              ((del - kOnes) & ~del) | ((v - kOnes * 0x20) & ~v)) &  // below 0x20
                             kHighs;
    if (special != 0) return i + static_cast<size_t>(__builtin_ctzll(special)) / 8;
  }
  for (; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') break;
  }
  return i;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.reserve(out.size() + s.size() + 2);
  out.push_back('"');
  // Bytes that need no escape are copied in runs (one append per run, not one push_back each).
  for (size_t i = 0;; ++i) {
    const size_t plain = unescaped_prefix(s.substr(i));
    out.append(s.data() + i, plain);
    i += plain;
    if (i >= s.size()) break;
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:  // the other control characters and DEL
        out += "\\u00";
        out.push_back(kHex[c >> 4]);
        out.push_back(kHex[c & 0xF]);
    }
  }
  out.push_back('"');
}

std::string json_string(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  append_json_string(out, s);
  return out;
}

std::string json_int(int64_t value) { return std::to_string(value); }
std::string json_uint(uint64_t value) { return std::to_string(value); }

void JsonObjectWriter::start_member(std::string_view key) {
  if (out_.size() > 1) {
    out_.push_back(',');
  } else {
    out_.reserve(128);  // the usual kv_transfer_params object in one allocation
  }
  append_json_string(out_, key);
  out_.push_back(':');
}

JsonObjectWriter& JsonObjectWriter::raw(std::string_view key, std::string_view raw_value) {
  start_member(key);
  out_.append(raw_value);
  return *this;
}

JsonObjectWriter& JsonObjectWriter::string(std::string_view key, std::string_view value) {
  start_member(key);
  append_json_string(out_, value);
  return *this;
}

JsonObjectWriter& JsonObjectWriter::integer(std::string_view key, int64_t value) {
  start_member(key);
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof(digits), value).ptr;
  out_.append(digits, end);
  return *this;
}

std::string JsonObjectWriter::finish() const {
  std::string out;
  out.reserve(out_.size() + 1);
  out.append(out_);
  out.push_back('}');
  return out;
}

}  // namespace pdr::proto
