#include "proto/prometheus_merge.h"

#include <array>
#include <charconv>
#include <limits>
#include <unordered_set>

namespace pdr::proto {
namespace {

bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }
bool space(char c) { return c == ' ' || c == '\t'; }

// [a-zA-Z_:][a-zA-Z0-9_:]* (metric) or [a-zA-Z_][a-zA-Z0-9_]* (label), read from the front of
// `s`; empty when there is none.
std::string_view take_name(std::string_view& s, bool metric) {
  size_t n = 0;
  while (n < s.size() && (name_char(s[n]) || (metric && s[n] == ':'))) {
    if (n == 0 && s[n] >= '0' && s[n] <= '9') break;
    ++n;
  }
  const std::string_view name = s.substr(0, n);
  s.remove_prefix(n);
  return name;
}

void skip_spaces(std::string_view& s) {
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
}

std::string_view take_token(std::string_view& s) {
  size_t n = 0;
  while (n < s.size() && !space(s[n])) ++n;
  const std::string_view token = s.substr(0, n);
  s.remove_prefix(n);
  return token;
}

bool valid_metric_name(std::string_view name) {
  std::string_view rest = name;
  return !take_name(rest, true).empty() && rest.empty();
}

bool is_number(std::string_view token) {
  if (token == "NaN" || token == "+Inf" || token == "-Inf" || token == "Inf") return true;
  if (!token.empty() && token.front() == '+') token.remove_prefix(1);
  if (token.empty()) return false;
  // from_chars would take "inf" / "nan" spellings the format does not: digits only.
  for (char c : token) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+')) return false;
  }
  double value = 0;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  return ec == std::errc() && end == token.data() + token.size();
}

bool is_timestamp(std::string_view token) {
  if (!token.empty() && token.front() == '-') token.remove_prefix(1);
  if (token.empty() || token.size() > 20) return false;
  for (char c : token) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool known_type(std::string_view type) {
  static constexpr std::array<std::string_view, 9> kTypes{"counter", "gauge",   "histogram", "summary", "untyped",
                                                          "info",    "stateset", "gaugehistogram", "unknown"};
  for (std::string_view t : kTypes) {
    if (t == type) return true;
  }
  return false;
}

// HELP text cut to `max` bytes without leaving half an escape (a trailing lone backslash).
std::string cut_help(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  std::string_view cut = text.substr(0, max);
  size_t backslashes = 0;
  while (backslashes < cut.size() && cut[cut.size() - 1 - backslashes] == '\\') ++backslashes;
  if (backslashes % 2 == 1) cut.remove_suffix(1);
  return std::string(cut);
}

// The labels of one sample, "{...}" at the front of `s`, appended to `out` as (name, value)
// views (values as they were sent: their escapes were checked). False when malformed or over the
// limits.
bool take_labels(std::string_view& s, const PromMergeLimits& limits,
                 std::vector<std::pair<std::string_view, std::string_view>>* out) {
  s.remove_prefix(1);  // '{'
  size_t count = 0;
  for (;;) {
    skip_spaces(s);
    if (!s.empty() && s.front() == '}') {
      s.remove_prefix(1);
      return true;
    }
    const std::string_view name = take_name(s, false);
    if (name.empty() || name.size() > limits.max_name_bytes || name.starts_with("pdrouter_")) return false;
    skip_spaces(s);
    if (s.empty() || s.front() != '=') return false;
    s.remove_prefix(1);
    skip_spaces(s);
    if (s.empty() || s.front() != '"') return false;
    s.remove_prefix(1);
    size_t n = 0;
    for (;;) {
      if (n >= s.size()) return false;
      const char c = s[n];
      if (c == '"') break;
      if (c == '\\') {
        if (n + 1 >= s.size() || (s[n + 1] != '\\' && s[n + 1] != '"' && s[n + 1] != 'n')) return false;
        n += 2;
        continue;
      }
      ++n;
    }
    if (n > limits.max_label_value_bytes || ++count > limits.max_labels) return false;
    out->emplace_back(name, s.substr(0, n));
    s.remove_prefix(n + 1);
    skip_spaces(s);
    if (!s.empty() && s.front() == ',') {
      s.remove_prefix(1);
    } else if (s.empty() || s.front() != '}') {
      return false;
    }
  }
}

constexpr std::array<std::string_view, 5> kSuffixes{"_bucket", "_sum", "_count", "_created", "_total"};

}  // namespace

std::string prom_escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

bool parse_prom_sample(std::string_view line, const PromMergeLimits& limits, PromSample* out) {
  out->labels.clear();
  if (line.size() > limits.max_line_bytes) return false;
  std::string_view rest = line;
  skip_spaces(rest);
  const std::string_view name = take_name(rest, true);
  if (name.empty() || name.size() > limits.max_name_bytes) return false;
  if (!rest.empty() && rest.front() == '{' && !take_labels(rest, limits, &out->labels)) return false;
  if (rest.empty() || !space(rest.front())) return false;
  skip_spaces(rest);
  const std::string_view value = take_token(rest);
  skip_spaces(rest);
  const std::string_view timestamp = take_token(rest);
  skip_spaces(rest);
  if (!is_number(value) || (!timestamp.empty() && !is_timestamp(timestamp)) || !rest.empty()) return false;
  out->name = name;
  out->value = value;
  out->timestamp = timestamp;
  return true;
}

double prom_sample_value(std::string_view value) {
  if (value == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (value == "+Inf" || value == "Inf") return std::numeric_limits<double>::infinity();
  if (value == "-Inf") return -std::numeric_limits<double>::infinity();
  if (!value.empty() && value.front() == '+') value.remove_prefix(1);
  double v = std::numeric_limits<double>::quiet_NaN();
  std::from_chars(value.data(), value.data() + value.size(), v);
  return v;
}

PromMerger::Family& PromMerger::family(std::string_view name) {
  auto it = index_.find(std::string(name));
  if (it != index_.end()) return families_[it->second].second;
  index_.emplace(std::string(name), families_.size());
  families_.emplace_back(std::string(name), Family{});
  return families_.back().second;
}

PromPageStats PromMerger::add(std::string_view page,
                              const std::vector<std::pair<std::string, std::string>>& labels) {
  PromPageStats stats;
  std::string prefix;
  for (const auto& [name, value] : labels) {
    if (!prefix.empty()) prefix += ',';
    prefix += name;
    prefix += "=\"";
    prefix += prom_escape_label_value(value);
    prefix += '"';
  }
  std::unordered_set<std::string> conflicting;  // families this page typed differently
  PromSample parsed;
  size_t lines = 0;
  while (!page.empty()) {
    const size_t eol = page.find('\n');
    std::string_view line = page.substr(0, eol);
    page = eol == std::string_view::npos ? std::string_view() : page.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (++lines > limits_.max_lines) {
      ++stats.over_limit;
      continue;
    }
    std::string_view rest = line;
    skip_spaces(rest);
    if (rest.empty()) continue;
    if (line.size() > limits_.max_line_bytes) {
      ++stats.malformed;
      continue;
    }
    if (rest.front() == '#') {
      rest.remove_prefix(1);
      skip_spaces(rest);
      const std::string_view keyword = take_token(rest);
      if (keyword != "HELP" && keyword != "TYPE") continue;  // a comment, "# EOF"
      skip_spaces(rest);
      const std::string_view name = take_token(rest);
      if (!valid_metric_name(name) || name.size() > limits_.max_name_bytes) {
        ++stats.malformed;
        continue;
      }
      skip_spaces(rest);
      if (keyword == "HELP") {
        Family& f = family(name);
        if (f.help.empty()) f.help = cut_help(rest, limits_.max_help_bytes);
        continue;
      }
      const std::string_view type = take_token(rest);
      skip_spaces(rest);
      if (!known_type(type) || !rest.empty()) {
        ++stats.malformed;
        continue;
      }
      Family& f = family(name);
      if (f.type.empty()) {
        f.type = std::string(type);
      } else if (f.type != type) {
        conflicting.emplace(name);
      }
      continue;
    }
    // A sample.
    if (!parse_prom_sample(line, limits_, &parsed)) {
      ++stats.malformed;
      continue;
    }
    const std::string_view name = parsed.name;
    const std::string_view value = parsed.value;
    const std::string_view timestamp = parsed.timestamp;
    std::string own_labels;
    for (const auto& [label, label_value] : parsed.labels) {
      own_labels += ',';
      own_labels += label;
      own_labels += "=\"";
      own_labels += label_value;
      own_labels += '"';
    }
    // Its family: the declared one its name (or, for histograms and summaries, its name less a
    // suffix) names; else its own.
    std::string_view family_name = name;
    auto declared = [&](std::string_view n) {
      auto it = index_.find(std::string(n));
      return it != index_.end() && !families_[it->second].second.type.empty();
    };
    if (!declared(name)) {
      for (std::string_view suffix : kSuffixes) {
        if (name.size() > suffix.size() && name.ends_with(suffix) &&
            declared(name.substr(0, name.size() - suffix.size()))) {
          family_name = name.substr(0, name.size() - suffix.size());
          break;
        }
      }
    }
    if (conflicting.contains(std::string(family_name))) {
      ++stats.conflicts;
      continue;
    }
    if (samples_ >= limits_.max_samples) {
      ++stats.over_limit;
      continue;
    }
    std::string sample;
    sample.reserve(name.size() + prefix.size() + own_labels.size() + value.size() + timestamp.size() + 5);
    sample += name;
    if (!prefix.empty() || !own_labels.empty()) {
      sample += '{';
      sample += prefix;
      if (prefix.empty()) {
        sample.append(own_labels, 1);  // no leading comma
      } else {
        sample += own_labels;
      }
      sample += '}';
    }
    sample += ' ';
    sample += value;
    if (!timestamp.empty()) {
      sample += ' ';
      sample += timestamp;
    }
    family(family_name).samples.push_back(std::move(sample));
    ++samples_;
    ++stats.samples;
  }
  return stats;
}

void PromMerger::add_own(std::string_view name, std::string_view help, std::string_view type, std::string line) {
  Family& f = family(name);
  if (f.help.empty()) f.help = std::string(help);
  if (f.type.empty()) f.type = std::string(type);
  f.samples.push_back(std::move(line));
}

std::string PromMerger::render() const {
  std::string out;
  for (const auto& [name, f] : families_) {
    if (f.samples.empty()) continue;
    if (!f.help.empty()) out += "# HELP " + name + " " + f.help + "\n";
    if (!f.type.empty()) out += "# TYPE " + name + " " + f.type + "\n";
    for (const std::string& sample : f.samples) {
      out += sample;
      out += '\n';
    }
  }
  return out;
}

}  // namespace pdr::proto
