#include "proto/engine_load_page.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace pdr::proto {
namespace {

enum class Family : uint8_t { kRunning, kWaiting, kKvUsage, kOther };

Family family_of(std::string_view name) {
  if (name == "vllm:num_requests_running") return Family::kRunning;
  if (name == "vllm:num_requests_waiting") return Family::kWaiting;
  // vLLM renamed the KV usage gauge (gpu_cache_usage_perc is the name before v0.10); a page has
  // one or the other.
  if (name == "vllm:kv_cache_usage_perc" || name == "vllm:gpu_cache_usage_perc") return Family::kKvUsage;
  return Family::kOther;
}

// The DP rank an `engine` label names, if it is a plain decimal index below `max`.
bool engine_rank(std::string_view value, uint32_t max, uint32_t* out) {
  if (value.empty() || value.size() > 9) return false;
  uint32_t rank = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), rank);
  if (ec != std::errc() || end != value.data() + value.size() || rank >= max) return false;
  *out = rank;
  return true;
}

struct Sums {
  double running = 0, waiting = 0, kv = 0;
  uint32_t kv_samples = 0;
};

}  // namespace

std::string_view to_string(EngineLoadPage::Outcome outcome) {
  switch (outcome) {
    case EngineLoadPage::Outcome::kOk: return "ok";
    case EngineLoadPage::Outcome::kMalformed: return "malformed";
    case EngineLoadPage::Outcome::kMissingFamilies: return "missing_families";
  }
  return "malformed";
}

EngineLoadPage read_engine_load_page(std::string_view page, const EngineLoadPageLimits& limits) {
  EngineLoadPage out;
  Sums node;
  std::vector<Sums> ranks;
  bool saw_running = false, saw_waiting = false, unusable = false;
  size_t samples = 0, other_lines = 0, lines = 0;
  PromSample sample;
  while (!page.empty() && lines < limits.lines.max_lines) {
    ++lines;
    const size_t eol = page.find('\n');
    std::string_view line = page.substr(0, eol);
    page = eol == std::string_view::npos ? std::string_view() : page.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#') continue;
    if (!parse_prom_sample(line, limits.lines, &sample)) {
      ++other_lines;
      continue;
    }
    ++samples;
    const Family family = family_of(sample.name);
    if (family == Family::kOther) continue;
    const double value = prom_sample_value(sample.value);
    const double max = family == Family::kKvUsage ? 1.0 : EngineLoadPage::kMaxCount;
    if (!std::isfinite(value) || value < 0 || value > max) {
      unusable = true;
      continue;
    }
    Sums* rank = nullptr;
    for (const auto& [label, label_value] : sample.labels) {
      uint32_t index = 0;
      if (label == "engine" && engine_rank(label_value, limits.max_ranks, &index)) {
        if (ranks.size() <= index) ranks.resize(index + 1);
        rank = &ranks[index];
        break;
      }
    }
    for (Sums* s : {&node, rank}) {
      if (s == nullptr) continue;
      switch (family) {
        case Family::kRunning: s->running += value; break;
        case Family::kWaiting: s->waiting += value; break;
        case Family::kKvUsage:
          s->kv += value;
          ++s->kv_samples;
          break;
        case Family::kOther: break;
      }
    }
    saw_running = saw_running || family == Family::kRunning;
    saw_waiting = saw_waiting || family == Family::kWaiting;
  }
  if (unusable || (samples == 0 && other_lines > 0)) {
    out.outcome = EngineLoadPage::Outcome::kMalformed;
    return out;
  }
  if (!saw_running || !saw_waiting) {
    out.outcome = EngineLoadPage::Outcome::kMissingFamilies;
    return out;
  }
  auto figures = [](const Sums& s) {
    EngineLoadFigures f;
    // vLLM writes gauges as floats ("3.0"); many samples of at most kMaxCount each could still
    // pass UINT32_MAX: clamp rather than wrap.
    f.running = static_cast<uint32_t>(std::min(std::round(s.running), 4e9));
    f.waiting = static_cast<uint32_t>(std::min(std::round(s.waiting), 4e9));
    f.kv_cache_usage = s.kv_samples == 0 ? -1.0 : s.kv / s.kv_samples;
    return f;
  };
  out.outcome = EngineLoadPage::Outcome::kOk;
  out.node = figures(node);
  out.ranks.reserve(ranks.size());
  for (const Sums& s : ranks) out.ranks.push_back(figures(s));
  return out;
}

}  // namespace pdr::proto
