// JSON request bodies edited by splicing: validate untrusted bytes once (a strict scanner that
// records where each top-level member lives, with simdjson's verdict on the rare documents where it
// could differ), then replace, append or remove a few
// top-level members and render the original bytes with only those edits spliced in. Every byte the
// edits do not touch (whitespace, key order, nested objects, unicode escapes, number spellings) is
// preserved exactly, which is what docs/design/request-flow.md asks of the per-leg body builders. Pure; no I/O.
//
// Contract:
//   - JsonObjectBody::parse accepts exactly one JSON value (RFC 8259; surrounding whitespace
//     allowed) that must be an object. Errors: kTooLarge (size limit), kTooDeep (depth limit),
//     kMalformed ("invalid JSON at byte N: <what>"; N is 0-based), kWrongType (not an object),
//     kInvalidValue (a top-level key occurs twice — ambiguous: Python keeps the last one, other
//     parsers the first). Keys are compared after unescaping ("\u006dax_tokens" == "max_tokens").
//   - Edits address top-level members by their unescaped key. set_raw() takes a complete, valid JSON
//     value text (use the json_* builders below); it is not re-validated.
//   - render() never fails and is valid JSON whenever the raw values passed to set_raw() were.
//   - Not thread-safe. A JsonObjectBody shares its (immutable) text with its copies: copying one to
//     edit it differently (a prefill and a decode leg from one client body) copies the member
//     table and the edits, never the document nor a key (keys are views into the document; only
//     a key spelled with escapes keeps its unescaped copy). parse_owned() takes the bytes without
//     a copy; parse_borrowed() refers to the caller's bytes.
//   - Views returned by original() stay valid while the document does (any copy keeps it); views
//     returned by get_raw() until the next set_raw() on this body (edited values share one
//     buffer per body).
//   - json_object_parses() counts parse() calls on the calling thread (tests: parse-once checks).
//   - Validation costs one pass of the strict scanner plus a UTF-8 check; simdjson runs as well
//     only on the rare documents where its verdict could differ (json_splice.cc, Scanner), with
//     the same outcome and messages as running both on every document.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

struct JsonLimits {
  size_t max_bytes = 8 * 1024 * 1024;  // whole document
  size_t max_depth = 64;               // nesting of objects/arrays (top-level object is depth 1)
};

class JsonObjectBody {
 public:
  JsonObjectBody() = default;
  // Gives the storage of its tables (up to a usual body's size) to the thread's spares, which the
  // next copy, parse or edit on the thread reuses: no allocation per leg body once warm.
  ~JsonObjectBody();
  JsonObjectBody(const JsonObjectBody& other);
  JsonObjectBody& operator=(const JsonObjectBody& other);
  // A moved-from body is empty (as a default-constructed one).
  JsonObjectBody(JsonObjectBody&& other) noexcept { *this = std::move(other); }
  JsonObjectBody& operator=(JsonObjectBody&& other) noexcept;

  static Status parse(std::string_view text, const JsonLimits& limits, JsonObjectBody* out);
  // The same, keeping `text` itself as the document (moved from only on success).
  static Status parse_owned(std::string&& text, const JsonLimits& limits, JsonObjectBody* out);
  // The same without a copy: `text` must outlive *out and every copy of it. For a short-lived
  // body read in one function (a prefill's answer); values it hands to set_raw() of a longer-lived
  // body are copied there.
  static Status parse_borrowed(std::string_view text, const JsonLimits& limits, JsonObjectBody* out);
  // parse_borrowed() of a member's value obtained with get_raw() from a body parsed by one of the
  // functions above (a prefill answer's kv_transfer_params), or of text made by the builders
  // below: known-valid JSON within the limits, so it is only indexed, not validated again. The
  // outcome is parse_borrowed()'s for such text (kWrongType when not an object, kInvalidValue
  // for a duplicate key); anything else passed here is a caller's bug.
  static Status parse_member_borrowed(std::string_view raw_value, const JsonLimits& limits,
                                      JsonObjectBody* out);

  // Empties the body (as a default-constructed one) but keeps the capacity of its tables (up to a
  // few dozen members): a body reused for one short-lived parse after another allocates nothing
  // once grown. parse() and its variants start with it.
  void clear();

  // The original document (before edits); empty for a default-constructed body.
  std::string_view original() const { return doc_; }

  // Current raw value text of a top-level member (after edits), or nullopt when absent.
  std::optional<std::string_view> get_raw(std::string_view key) const;
  bool has(std::string_view key) const { return get_raw(key).has_value(); }
  bool is_null(std::string_view key) const;  // present with value null

  // Typed getters. Absent key -> OK with *out = nullopt. Present but of another type ->
  // kWrongType naming the key ("max_tokens must be an integer, got 12.5"). Integers outside int64
  // -> kOutOfRange. JSON null is reported as kWrongType by these getters (check is_null() first
  // when null is acceptable).
  Status get_int(std::string_view key, std::optional<int64_t>* out) const;
  Status get_bool(std::string_view key, std::optional<bool>* out) const;
  Status get_string(std::string_view key, std::optional<std::string>* out) const;  // unescaped

  // Replaces the value in place if the key exists, else appends `,"key":value` before the final
  // `}` (after earlier appends, in call order).
  void set_raw(std::string_view key, std::string_view raw_json_value);
  // Deletes the member and exactly one adjoining comma. No-op when absent.
  void remove(std::string_view key);

  std::string render() const;
  // render() appended to *out (for writing a body straight into a wire buffer), and its size.
  void render_into(std::string* out) const;
  size_t rendered_size() const;
  // Number of top-level members currently present.
  size_t size() const;

 private:
  // A top-level member: an original one (offsets into the document), or an appended one (after
  // the original_count_ original ones; key and value in edits_).
  struct Member {
    size_t key_begin = 0;    // original: the key's opening quote; appended: the key in edits_
    size_t key_end = 0;      // one past the key's closing quote / one past the key in edits_
    size_t value_begin = 0;  // original only
    size_t value_end = 0;    // one past the value
    size_t edit_begin = 0;   // replaced or appended: the value is edits_[edit_begin, +edit_size)
    size_t edit_size = 0;
    bool removed = false;
    bool replaced = false;     // (every appended member is)
    bool appended = false;
    bool key_escaped = false;  // original key with escapes: unescaped_key holds it unescaped
    std::string unescaped_key;
  };
  // Room for appended members reserved by a copy (a leg's few appends cost no reallocation).
  static constexpr size_t kAppendRoom = 4;

  enum class Validation { kFull, kInsideValidated };
  static Status parse_view(std::string_view text, const JsonLimits& limits, Validation validation,
                           JsonObjectBody* out);
  static std::string_view original_key(std::string_view doc, const Member& m);
  std::string_view key_of(const Member& m) const;
  std::string_view edit(size_t begin, size_t size) const { return std::string_view(edits_).substr(begin, size); }
  size_t add_edit(std::string_view bytes);  // appends to edits_, returns the offset
  // The calling thread's emptied tables of destroyed bodies (json_splice.cc); null once destroyed.
  struct Spares;
  static Spares* spares();
  // Storage from the thread's spares (see the destructor) when this body has none yet.
  void take_spare_members();
  void take_spare_edits();
  template <typename Append>
  void emit(Append&& append) const;
  Member* find_member(std::string_view key);
  const Member* find_member(std::string_view key) const;

  std::shared_ptr<const std::string> owner_;  // the document's storage, shared by copies; null when
                                              // borrowed or default-constructed
  std::string_view doc_;                      // the document
  size_t close_brace_ = 0;  // offset of the top-level object's '}'
  size_t original_count_ = 0;
  std::vector<Member> members_;
  std::string edits_;  // bytes of replaced values and of appended keys and values
};

// JsonObjectBody::parse(), parse_owned(), parse_borrowed() and parse_member_borrowed() calls made
// on the calling thread so far.
uint64_t json_object_parses();
// Of those, the ones that ran simdjson as well as the strict scanner (a document the scanner
// rejects, or one whose UTF-8, number ranges, surrogate escapes or depth need simdjson's verdict).
uint64_t json_simdjson_runs();
// Tests: true makes every parse on the calling thread run simdjson as well (as before the scanner
// decided alone on plain documents), to compare outcomes and messages with the default.
void set_json_simdjson_on_every_parse(bool on);

// ---- builders for raw JSON value text ----
std::string json_string(std::string_view utf8);  // quoted and escaped (", \, control chars)
void append_json_string(std::string& out, std::string_view utf8);  // the same, appended to `out`
std::string json_int(int64_t value);
std::string json_uint(uint64_t value);
inline std::string json_bool(bool value) { return value ? "true" : "false"; }
inline std::string json_null() { return "null"; }

// Builds a JSON object text member by member, in insertion order: {"k":v,...}.
class JsonObjectWriter {
 public:
  JsonObjectWriter& raw(std::string_view key, std::string_view raw_value);
  JsonObjectWriter& string(std::string_view key, std::string_view value);  // quoted and escaped
  JsonObjectWriter& integer(std::string_view key, int64_t value);
  JsonObjectWriter& boolean(std::string_view key, bool value) { return raw(key, value ? "true" : "false"); }
  JsonObjectWriter& null(std::string_view key) { return raw(key, "null"); }
  std::string finish() const;

 private:
  void start_member(std::string_view key);  // separator and "key":
  std::string out_ = "{";
};

// Unescapes the body of a JSON string literal given with its quotes (input must be a valid
// literal, e.g. a raw value obtained from a parsed JsonObjectBody). Returns false otherwise.
bool json_unescape_string(std::string_view literal, std::string* out);

}  // namespace pdr::proto
