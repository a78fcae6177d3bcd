// Merging the Prometheus text pages of several nodes into one (GET /engine_metrics): every sample
// gets the node's labels put first (pdrouter_node="host:port", pdrouter_role="decode"), samples of
// one family from every node are grouped under one HELP and one TYPE line, families in the order
// they were first seen. Pure: no I/O, no clocks; fuzzed by tests/fuzz.
//
// A node's page is untrusted input. Accepted lines (Prometheus text format 0.0.4, and the
// OpenMetrics lines vLLM's client library may add):
//   # HELP <name> <text>          kept from the first node that gave one (text at most
//                                 max_help_bytes, else cut)
//   # TYPE <name> <type>          counter gauge histogram summary untyped (also OpenMetrics' info,
//                                 stateset, gaugehistogram, unknown); the first node's wins; a
//                                 later node declaring another type has that family's samples
//                                 dropped (counted in `conflicts`)
//   other "#" lines, "# EOF", blank lines: skipped
//   <name>[{<label>="<value>",...}] <value> [<timestamp>]
// A sample line is refused (counted in `malformed`) when: its name is not [a-zA-Z_:][a-zA-Z0-9_:]*
// or longer than max_name_bytes; a label name is not [a-zA-Z_][a-zA-Z0-9_]* or starts with
// "pdrouter_" (the node must not forge the labels pdrouter adds); a label value is not a properly
// escaped quoted string (\\ \" \n only) or is longer than max_label_value_bytes; it has more than
// max_labels labels; its value is not a number (NaN, +Inf, -Inf accepted); anything follows the
// optional integer timestamp; or the line is longer than max_line_bytes. Lines beyond max_lines
// per page and samples beyond max_samples in total are dropped (counted in `over_limit`).
// Samples are re-emitted from their parsed parts, so nothing a node sends can break the page's
// syntax.
//
// A sample's family: the TYPE/HELP name it belongs to. For histogram and summary families the
// _bucket, _sum, _count (and OpenMetrics _created, counters' _total) suffixes map to the
// declared family; a sample of no declared family is its own untyped family.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pdr::proto {

struct PromMergeLimits {
  size_t max_lines = 100000;         // per page
  size_t max_line_bytes = 16 * 1024;
  size_t max_name_bytes = 256;
  size_t max_labels = 32;            // per sample, the node's own
  size_t max_label_value_bytes = 1024;
  size_t max_help_bytes = 1024;
  size_t max_samples = 1000000;      // over every page added
};

struct PromPageStats {
  uint64_t samples = 0;     // kept
  uint64_t malformed = 0;   // sample or TYPE lines refused
  uint64_t conflicts = 0;   // samples dropped: their family has another type on an earlier node
  uint64_t over_limit = 0;  // lines dropped beyond max_lines / max_samples
};

class PromMerger {
 public:
  explicit PromMerger(PromMergeLimits limits = {}) : limits_(limits) {}

  // Adds one node's page; `labels` (name, value) are put first on each of its samples (names
  // must be valid label names; values are escaped here).
  PromPageStats add(std::string_view page, const std::vector<std::pair<std::string, std::string>>& labels);

  // Adds one sample line built by the caller (e.g. pdrouter's own scrape status gauge), with the
  // family's HELP and TYPE if the family is new. `line` is trusted.
  void add_own(std::string_view family, std::string_view help, std::string_view type, std::string line);

  // The merged page (text format 0.0.4).
  std::string render() const;

 private:
  struct Family {
    std::string help;
    std::string type;  // "" until declared
    std::vector<std::string> samples;
  };
  Family& family(std::string_view name);

  PromMergeLimits limits_;
  std::vector<std::pair<std::string, Family>> families_;  // first-seen order
  std::unordered_map<std::string, size_t> index_;
  size_t samples_ = 0;
};

// One sample line read with exactly PromMerger's syntax, checks and limits (max_line_bytes,
// max_name_bytes, max_labels, max_label_value_bytes; a label name starting "pdrouter_" refused),
// for readers of a page that need its values rather than a merge (router/proxy/engine_load_scrape
// via proto/engine_load_page.h). Views into the line; label values still escaped as sent.
struct PromSample {
  std::string_view name;
  std::vector<std::pair<std::string_view, std::string_view>> labels;
  std::string_view value;
  std::string_view timestamp;  // "" when none
};
// False when `line` is not a well-formed sample line (blank and "#" lines are not samples).
bool parse_prom_sample(std::string_view line, const PromMergeLimits& limits, PromSample* out);
// A value parse_prom_sample accepted, as a double (NaN, +Inf and -Inf included).
double prom_sample_value(std::string_view value);

// The value escaped for a label value in the text format: \\, \" and \n.
std::string prom_escape_label_value(std::string_view value);

}  // namespace pdr::proto
