#include "bench/loadgen/metrics_scrape.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "bench/loadgen/bench_runner.h"
#include "bench/loadgen/resolve_host.h"

namespace pdr::loadgen {
namespace {

constexpr size_t kMaxLineBytes = 64 * 1024;
constexpr size_t kMaxPageBytes = 32u << 20;

// One sample line: name, its labels, its value. False when the line is not one.
bool parse_sample(std::string_view line, std::string_view* name,
                  std::vector<std::pair<std::string_view, std::string>>* labels, double* value) {
  labels->clear();
  size_t at = line.find_first_of("{ \t");
  if (at == std::string_view::npos || at == 0) return false;
  *name = line.substr(0, at);
  if (line[at] == '{') {
    ++at;
    while (true) {
      while (at < line.size() && (line[at] == ' ' || line[at] == ',')) ++at;
      if (at >= line.size()) return false;
      if (line[at] == '}') {
        ++at;
        break;
      }
      const size_t eq = line.find('=', at);
      if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return false;
      std::string_view label = line.substr(at, eq - at);
      std::string text;
      size_t i = eq + 2;
      for (; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size()) {
          ++i;
          text.push_back(line[i] == 'n' ? '\n' : line[i]);
        } else {
          text.push_back(line[i]);
        }
      }
      if (i >= line.size()) return false;
      labels->emplace_back(label, std::move(text));
      at = i + 1;
    }
  }
  while (at < line.size() && (line[at] == ' ' || line[at] == '\t')) ++at;
  const size_t end = line.find_first_of(" \t", at);
  const std::string number(line.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
  if (number.empty()) return false;
  char* stop = nullptr;
  *value = std::strtod(number.c_str(), &stop);
  return stop == number.c_str() + number.size() && std::isfinite(*value);
}

CacheRate rate_of(double matched, double prompt) {
  CacheRate r{.matched = matched, .prompt = prompt};
  if (prompt > 0) r.rate = matched / prompt;
  return r;
}

}  // namespace

std::map<std::string, double> sum_samples_by(std::string_view page, std::string_view name,
                                             const std::vector<std::string>& group_labels) {
  std::map<std::string, double> sums;
  std::string_view sample_name;
  std::vector<std::pair<std::string_view, std::string>> labels;
  double value = 0;
  size_t at = 0;
  while (at < page.size()) {
    size_t end = page.find('\n', at);
    if (end == std::string_view::npos) end = page.size();
    std::string_view line = page.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#' || line.size() > kMaxLineBytes) continue;
    if (!line.starts_with(name) || !parse_sample(line, &sample_name, &labels, &value) ||
        sample_name != name) {
      continue;
    }
    std::string key;
    for (size_t g = 0; g < group_labels.size(); ++g) {
      if (g != 0) key.push_back('/');
      for (const auto& [label, text] : labels) {
        if (label == group_labels[g]) {
          key += text;
          break;
        }
      }
    }
    sums[key] += value;
  }
  return sums;
}

Status parse_scrape_target(const std::string& url, ScrapeTarget* out) {
  proto::HttpUrl parsed;
  if (Status s = proto::parse_http_url(url, &parsed); !s) return {s.code(), url + ": " + s.message()};
  ScrapeTarget target{.url = url, .address = parsed.address,
                      .path = parsed.path.empty() ? "/metrics" : parsed.path};
  if (Status s = resolve_host(&target.address); !s) return {s.code(), url + ": " + s.message()};
  *out = std::move(target);
  return {};
}

Status scrape(const ScrapeTarget& target, const http::UpstreamTimeouts& timeouts, std::string* page) {
  http::UpstreamRequest request;
  request.method = "GET";
  request.path = target.path;
  FetchResult got = fetch(target.address, std::move(request), timeouts, kMaxPageBytes);
  if (!got.error) return {got.error.code(), fmt::format("GET {}: {}", target.url, got.error.message())};
  if (got.http_status != 200) {
    return {StatusCode::kRejected, fmt::format("GET {} answered {}", target.url, got.http_status)};
  }
  *page = std::move(got.body);
  return {};
}

CacheCounters router_cache_counters(const std::vector<std::string>& pages) {
  CacheCounters counters;
  const std::vector<std::string> by = {"leg", "source"};
  for (const std::string& page : pages) {
    for (const auto& [key, v] : sum_samples_by(page, "pdrouter_cache_routing_matched_units_total", by)) {
      counters.matched[key] += v;
    }
    for (const auto& [key, v] : sum_samples_by(page, "pdrouter_cache_routing_prompt_units_total", by)) {
      counters.prompt[key] += v;
    }
  }
  return counters;
}

CacheCounters engine_cache_counters(const std::vector<std::string>& urls,
                                    const std::vector<std::string>& pages) {
  CacheCounters counters;
  for (size_t i = 0; i < pages.size() && i < urls.size(); ++i) {
    for (const auto& [key, v] : sum_samples_by(pages[i], "vllm:prefix_cache_hits_total", {})) {
      counters.matched[urls[i]] += v;
    }
    for (const auto& [key, v] : sum_samples_by(pages[i], "vllm:prefix_cache_queries_total", {})) {
      counters.prompt[urls[i]] += v;
    }
  }
  return counters;
}

std::map<std::string, CacheRate> cache_rates(const CacheCounters& before, const CacheCounters& after) {
  const auto at = [](const std::map<std::string, double>& m, const std::string& key) {
    const auto it = m.find(key);
    return it == m.end() ? 0.0 : it->second;
  };
  std::map<std::string, CacheRate> rates;
  for (const auto& [key, prompt] : after.prompt) {
    rates[key] = rate_of(std::max(0.0, at(after.matched, key) - at(before.matched, key)),
                         std::max(0.0, prompt - at(before.prompt, key)));
  }
  return rates;
}

CacheRate total_rate(const std::map<std::string, CacheRate>& rates) {
  double matched = 0, prompt = 0;
  for (const auto& [key, r] : rates) {
    matched += r.matched;
    prompt += r.prompt;
  }
  return rate_of(matched, prompt);
}

RouterRate router_headline_rate(const std::map<std::string, CacheRate>& rates, double prompt_tokens) {
  for (const char* leg : {"prefill", "decode"}) {
    const std::string events = fmt::format("{}/kv_events", leg);
    if (const auto it = rates.find(events); it != rates.end() && it->second.prompt > 0 && prompt_tokens > 0) {
      return {rate_of(std::min(it->second.matched, prompt_tokens), prompt_tokens), events};
    }
    const std::string tree = fmt::format("{}/prefix_tree", leg);
    if (const auto it = rates.find(tree); it != rates.end() && it->second.prompt > 0) {
      return {it->second, tree};
    }
  }
  return {};
}

CacheSnapshot take_snapshot(const std::vector<ScrapeTarget>& routers,
                            const std::vector<ScrapeTarget>& engines,
                            const http::UpstreamTimeouts& timeouts) {
  CacheSnapshot snapshot;
  std::vector<std::string> pages, urls;
  for (const ScrapeTarget& target : routers) {
    std::string page;
    if (Status s = scrape(target, timeouts, &page); !s) {
      snapshot.errors.push_back(s.message());
    } else {
      pages.push_back(std::move(page));
    }
  }
  snapshot.router = router_cache_counters(pages);
  pages.clear();
  for (const ScrapeTarget& target : engines) {
    std::string page;
    if (Status s = scrape(target, timeouts, &page); !s) {
      snapshot.errors.push_back(s.message());
    } else {
      pages.push_back(std::move(page));
      urls.push_back(target.url);
    }
  }
  snapshot.engine = engine_cache_counters(urls, pages);
  return snapshot;
}

CacheReport compare_snapshots(bool routers, bool engines, const CacheSnapshot& before,
                              const CacheSnapshot& after) {
  CacheReport report;
  report.router_scraped = routers;
  report.engine_scraped = engines;
  report.router = cache_rates(before.router, after.router);
  report.engine = cache_rates(before.engine, after.engine);
  report.scrape_errors = before.errors;
  report.scrape_errors.insert(report.scrape_errors.end(), after.errors.begin(), after.errors.end());
  return report;
}

}  // namespace pdr::loadgen
