// Reasons behind the generic YAML reading layer; contracts are in yaml_reader.h.
#include "discovery/config/yaml_reader.h"

#include <fmt/format.h>
#include <yaml-cpp/anchor.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pdr::config::yaml {

namespace {

constexpr uint64_t kMaxU32 = 0xffffffffull;

}  // namespace

Status fail_at(const Source& src, const YAML::Mark& mark, std::string_view path, StatusCode code,
               std::string_view what) {
  std::string msg = src.filename;
  if (!mark.is_null()) msg += fmt::format(":{}:{}", mark.line + 1, mark.column + 1);
  msg += ": ";
  if (!path.empty()) {
    msg += path;
    msg += ": ";
  }
  msg += what;
  return Status(code, std::move(msg));
}

Status fail(const Source& src, const Field& f, StatusCode code, std::string_view what) {
  return fail_at(src, f.mark(), f.path, code, what);
}

std::string quoted_excerpt(std::string_view text) {
  constexpr size_t kMax = 40;
  std::string out = "'";
  out += text.substr(0, kMax);
  if (text.size() > kMax) out += "...";
  out += "'";
  return out;
}

bool is_quoted_or_tagged_string(const YAML::Node& n) {
  // yaml-cpp reports "!" for quoted scalars and "?" for plain, untagged ones.
  return n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str";
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return (is_quoted_or_tagged_string(n) ? "the string " : "") + quoted_excerpt(n.Scalar());
  }
  return "an unknown node";
}

// ---- scalar readers -------------------------------------------------------------------------

Status read_uint(const Source& src, const Field& f, uint64_t min, uint64_t max, uint64_t* out,
                 std::string_view what) {
  const YAML::Node& n = f.value;
  if (!n.IsScalar()) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected {}, got {}", what, describe(n)));
  }
  const std::string& text = n.Scalar();
  if (n.Tag() != "?" && n.Tag() != "tag:yaml.org,2002:int") {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected {}, got {}", what, describe(n)));
  }
  if (!text.empty() && text[0] == '-' && text.size() > 1 &&
      std::all_of(text.begin() + 1, text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return fail(
        src, f, StatusCode::kOutOfRange,
        fmt::format("negative numbers are not allowed (got {}; expected {}..{})", text, min, max));
  }
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool all_digits =
      !text.empty() && end == text.data() + text.size() &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!all_digits || ec == std::errc::invalid_argument) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected {}, got {}", what, describe(n)));
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    return fail(src, f, StatusCode::kOutOfRange,
                fmt::format("{} is out of range ({}..{})", text, min, max));
  }
  *out = v;
  return Status::ok();
}

Status read_string(const Source& src, const Field& f, size_t max_bytes, std::string* out) {
  const YAML::Node& n = f.value;
  if (n.IsNull()) {
    return fail(src, f, StatusCode::kWrongType,
                "expected a string, got null (write \"\" for empty)");
  }
  if (!n.IsScalar()) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected a string, got {}", describe(n)));
  }
  const std::string& text = n.Scalar();
  if (text.size() > max_bytes) {
    return fail(src, f, StatusCode::kTooLarge,
                fmt::format("string is {} bytes long (limit {})", text.size(), max_bytes));
  }
  if (has_control_chars(text)) {
    return fail(src, f, StatusCode::kInvalidValue, "string contains control characters");
  }
  *out = text;
  return Status::ok();
}

Status read_bool(const Source& src, const Field& f, bool* out) {
  const YAML::Node& n = f.value;
  if (n.IsScalar() && !is_quoted_or_tagged_string(n)) {
    std::string lower = n.Scalar();
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "true" || lower == "false") {
      *out = lower == "true";
      return Status::ok();
    }
  }
  return fail(src, f, StatusCode::kWrongType,
              fmt::format("expected true or false, got {}", describe(n)));
}

// ---- maps ---------------------------------------------------------------------------------------

MapReader::MapReader(const Source& src, const Field& map) : src_(src), map_(map) { open(); }

const Field* MapReader::take(std::string_view key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.push_back(key);
  if (!ok()) return nullptr;
  for (Entry& e : entries_) {
    if (e.name == key) {
      e.consumed = true;
      return &e.field;
    }
  }
  return nullptr;
}

void MapReader::u32(std::string_view key, uint64_t min, uint64_t max, uint32_t* out) {
  with(key, [&](const Field& f) {
    uint64_t v = 0;
    Status s = read_uint(src_, f, min, std::min(max, kMaxU32), &v);
    if (s) *out = static_cast<uint32_t>(v);
    return s;
  });
}

void MapReader::port(std::string_view key, uint16_t* out) {
  with(key, [&](const Field& f) {
    uint64_t v = 0;
    Status s = read_uint(src_, f, 1, 65535, &v, "a port number");
    if (s) *out = static_cast<uint16_t>(v);
    return s;
  });
}

void MapReader::ms(std::string_view key, uint64_t min, uint64_t max,
                   std::chrono::milliseconds* out) {
  with(key, [&](const Field& f) {
    uint64_t v = 0;
    Status s = read_uint(src_, f, min, max, &v, "an integer number of milliseconds");
    if (s) *out = std::chrono::milliseconds(static_cast<int64_t>(v));
    return s;
  });
}

void MapReader::str(std::string_view key, size_t max_bytes, std::string* out) {
  with(key, [&](const Field& f) { return read_string(src_, f, max_bytes, out); });
}

void MapReader::boolean(std::string_view key, bool* out) {
  with(key, [&](const Field& f) { return read_bool(src_, f, out); });
}

Status MapReader::finish() {
  if (!ok()) return status_;
  for (const Entry& e : entries_) {
    if (e.consumed) continue;
    std::string where = map_.path.empty() ? "at top level" : "in " + map_.path;
    return fail_at(src_, e.field.key.Mark(), "", StatusCode::kInvalidValue,
                   fmt::format("unknown key {} {} ({})", quoted_excerpt(e.name), where,
                               unknown_key_hint(e.name, known_)));
  }
  return Status::ok();
}

void MapReader::open() {
  const YAML::Node& n = map_.value;
  if (n.IsNull()) return;  // `section:` written but left empty: all defaults
  if (!n.IsMap()) {
    status_ = fail(src_, map_, StatusCode::kWrongType,
                   fmt::format("expected a map, got {}", describe(n)));
    return;
  }
  for (auto it = n.begin(); it != n.end(); ++it) {
    const YAML::Node key = it->first;  // it-> yields a temporary: copy, do not bind
    if (!key.IsScalar()) {
      status_ = fail_at(src_, key.Mark(), map_.path, StatusCode::kWrongType,
                        fmt::format("keys must be plain names, got {}", describe(key)));
      return;
    }
    const std::string& name = key.Scalar();
    std::string path = map_.path.empty() ? name : map_.path + "." + name;
    for (const Entry& e : entries_) {
      if (e.name == name) {
        status_ =
            fail_at(src_, key.Mark(), path, StatusCode::kInvalidValue,
                    fmt::format("duplicate key (first at line {})", e.field.key.Mark().line + 1));
        return;
      }
    }
    entries_.push_back(Entry{name, Field{key, it->second, std::move(path)}});
  }
}

// ---- YAML-bomb budget -------------------------------------------------------------------------

namespace {

Status too_many_nodes(const Source& src, const YAML::Mark& mark) {
  return fail_at(
      src, mark, "", StatusCode::kTooLarge,
      fmt::format("document has more than {} nodes (aliases count each time they are used)",
                  kMaxNodes));
}

Status too_deep(const Source& src, const YAML::Mark& mark) {
  return fail_at(src, mark, "", StatusCode::kTooDeep,
                 fmt::format("nesting is deeper than {} levels", kMaxDepth));
}

// First pass over the parser's events, before any tree is built: building yaml-cpp nodes for a
// 1 MiB flat list takes seconds and hundreds of MiB, counting its events stops after kMaxNodes.
// An alias counts as the size of the subtree its anchor named, so billion-laughs documents are
// measured as they would expand.
class NodeBudget : public YAML::EventHandler {
 public:
  struct Exceeded {
    YAML::Mark mark;
    bool depth;  // else node count
  };

  void OnDocumentStart(const YAML::Mark&) override { anchor_sizes_.clear(); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    add(mark, anchor < anchor_sizes_.size() ? anchor_sizes_[anchor] : 1);
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    leaf(mark, anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Open {
    YAML::anchor_t anchor;
    size_t count_before;
  };

  void add(const YAML::Mark& mark, size_t n) {
    nodes_ += n;
    if (nodes_ > kMaxNodes) throw Exceeded{mark, false};
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (open_.size() + 1 > kMaxDepth) throw Exceeded{mark, true};
    add(mark, 1);
    remember(anchor, 1);
  }
  void open(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (open_.size() + 1 > kMaxDepth) throw Exceeded{mark, true};
    open_.push_back(Open{anchor, nodes_});
    add(mark, 1);
  }
  void close() {
    Open o = open_.back();
    open_.pop_back();
    remember(o.anchor, nodes_ - o.count_before);
  }
  void remember(YAML::anchor_t anchor, size_t size) {
    if (anchor == YAML::NullAnchor) return;
    // Anchor ids count up from 1 within a document, so this grows with the node count only.
    if (anchor >= anchor_sizes_.size()) anchor_sizes_.resize(anchor + 1, 1);
    anchor_sizes_[anchor] = size;
  }

  size_t nodes_ = 0;
  std::vector<Open> open_;
  std::vector<size_t> anchor_sizes_;
};

}  // namespace

Status check_event_budget(const Source& src, const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  NodeBudget budget;
  try {
    while (parser.HandleNextDocument(budget)) {
    }
  } catch (const NodeBudget::Exceeded& e) {
    return e.depth ? too_deep(src, e.mark) : too_many_nodes(src, e.mark);
  }
  return Status::ok();
}

// Second line of defence on the built tree, where aliases share nodes: every visit counts, so
// depth reached through aliases is caught too and the walk itself stays bounded.
Status check_tree_size(const Source& src, const YAML::Node& n, size_t depth, size_t* nodes) {
  if (++*nodes > kMaxNodes) return too_many_nodes(src, n.Mark());
  if (depth > kMaxDepth) return too_deep(src, n.Mark());
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      Status s = check_tree_size(src, it->first, depth + 1, nodes);
      if (s) s = check_tree_size(src, it->second, depth + 1, nodes);
      if (!s) return s;
    }
  } else if (n.IsSequence()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      Status s = check_tree_size(src, *it, depth + 1, nodes);
      if (!s) return s;
    }
  }
  return Status::ok();
}

}  // namespace pdr::config::yaml
