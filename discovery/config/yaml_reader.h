// yaml-cpp nodes -> typed values, with errors shaped "FILE:LINE:COL: key.path: what". Knows nothing
// about the topology schema. Private to discovery/: only topology loading includes it, so yaml-cpp
// types stay out of every other header. Only check_event_budget() lets a yaml-cpp exception out
// (YAML::ParserException for a malformed document); callers catch it at their boundary.
#pragma once

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "discovery/config/key_hint.h"
#include "proto/base/ascii.h"
#include "proto/base/status.h"

namespace pdr::config::yaml {

// Default byte limit for a string value that has no tighter one of its own.
inline constexpr size_t kMaxStringBytes = 1024;

// What error messages are prefixed with, and what relative secret-file paths resolve against.
struct Source {
  std::string filename;
};

// One value in the document together with the key that introduced it (undefined for list items)
// and its dotted path ("discovery.ttl_ms", "instances[1].labels.zone").
struct Field {
  YAML::Node key;
  YAML::Node value;
  std::string path;

  // An empty value (`key:`) has no position of its own worth showing; yaml-cpp puts it on the next
  // line, so point at the key instead.
  YAML::Mark mark() const {
    if (value.IsNull() && key.IsDefined() && !key.Mark().is_null()) return key.Mark();
    return value.Mark();
  }
};

// Status(code, "FILE:LINE:COL: PATH: what"). A null mark drops ":LINE:COL", an empty path drops
// "PATH: ".
Status fail_at(const Source& src, const YAML::Mark& mark, std::string_view path, StatusCode code,
               std::string_view what);
// fail_at() at the field's mark and path.
Status fail(const Source& src, const Field& f, StatusCode code, std::string_view what);

// `text` in single quotes, cut to 40 bytes with "..." so a message stays one readable line.
std::string quoted_excerpt(std::string_view text);
// True for a scalar written quoted or tagged !!str, i.e. one the author meant as a string.
bool is_quoted_or_tagged_string(const YAML::Node& n);
// What a node is, for "expected X, got <describe>": "null", "a map", "the string 'x'", "'12'", ...
std::string describe(const YAML::Node& n);
using pdr::has_control_chars;  // proto/base/ascii.h
using config::edit_distance;     // discovery/config/key_hint.h
using config::unknown_key_hint;  // discovery/config/key_hint.h

// ---- scalar readers ---------------------------------------------------------------------------
// On error *out is untouched and the Status points at `f`.

// A plain (untagged or !!int) decimal integer in [min, max]. `what` names the expected value in
// wrong-type messages ("an integer", "a port number").
Status read_uint(const Source& src, const Field& f, uint64_t min, uint64_t max, uint64_t* out,
                 std::string_view what = "an integer");
// A scalar of at most `max_bytes` bytes without control characters. Null is an error.
Status read_string(const Source& src, const Field& f, size_t max_bytes, std::string* out);
// An unquoted true or false, in any letter case.
Status read_bool(const Source& src, const Field& f, bool* out);

// ---- maps ---------------------------------------------------------------------------------------

// Reads one YAML map section key by key. Calls after the first error do nothing, so a section is a
// straight list of reads followed by finish(), which reports keys nobody asked for (typos).
// A null value (`section:` left empty) is an empty map; anything else but a map is an error.
// Borrows `src` for its whole life.
class MapReader {
 public:
  MapReader(const Source& src, const Field& map);

  const Status& status() const { return status_; }
  bool ok() const { return status_.is_ok(); }
  const Field& self() const { return map_; }

  // The entry for `key`, or nullptr when absent (or after an error). Marks the key as known.
  const Field* take(std::string_view key);

  // Runs `read(field)` when the key is present and keeps its first error.
  template <typename Fn>
  void with(std::string_view key, Fn&& read) {
    const Field* f = take(key);
    if (f != nullptr) record(read(*f));
  }

  // Typed shorthands for with(): an integer in [min, max] (clamped to uint32), a port 1..65535, a
  // whole number of milliseconds in [min, max], a string, a boolean.
  void u32(std::string_view key, uint64_t min, uint64_t max, uint32_t* out);
  void port(std::string_view key, uint16_t* out);
  void ms(std::string_view key, uint64_t min, uint64_t max, std::chrono::milliseconds* out);
  void str(std::string_view key, size_t max_bytes, std::string* out);
  void boolean(std::string_view key, bool* out);

  // A name from a fixed set, parsed by `parse` (e.g. proto::parse_role). `what` and `expected`
  // fill "unknown WHAT 'x' (expected EXPECTED)".
  template <typename T>
  void name(std::string_view key, bool (*parse)(std::string_view, T*), std::string_view what,
            std::string_view expected, T* out) {
    with(key, [&](const Field& f) {
      std::string text;
      Status s = read_string(src_, f, kMaxStringBytes, &text);
      if (!s) return s;
      if (!parse(text, out)) {
        return fail(
            src_, f, StatusCode::kInvalidValue,
            fmt::format("unknown {} {} (expected {})", what, quoted_excerpt(text), expected));
      }
      return Status::ok();
    });
  }

  // Keeps `s` if it is the first error.
  void record(Status s) {
    if (ok() && !s.is_ok()) status_ = std::move(s);
  }

  // Reports the first key no read asked for. Call after every read of the section.
  Status finish();

 private:
  struct Entry {
    std::string name;
    Field field;
    bool consumed = false;
  };

  void open();

  const Source& src_;
  Field map_;
  std::vector<Entry> entries_;
  std::vector<std::string_view> known_;
  Status status_;
};

// ---- YAML-bomb budget -------------------------------------------------------------------------
// Both return kTooLarge past kMaxNodes nodes and kTooDeep past kMaxDepth levels of nesting,
// pointing at where the limit was crossed.

inline constexpr size_t kMaxNodes = 10000;
inline constexpr size_t kMaxDepth = 16;

// First pass over the parser's events, before any tree is built. Aliases count as the size of what
// their anchor named, so billion-laughs documents are measured as they would expand.
Status check_event_budget(const Source& src, const std::string& text);
// Second pass over a built tree, `n` being at nesting `depth`; `*nodes` counts visits across calls.
Status check_tree_size(const Source& src, const YAML::Node& n, size_t depth, size_t* nodes);

}  // namespace pdr::config::yaml
