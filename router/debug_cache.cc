#include "router/debug_cache.h"

#include <charconv>

#include <nlohmann/json.hpp>

#include "router/http/json_error.h"

namespace pdr::router {
namespace {

constexpr size_t kMaxLoraBytes = 256;

Status bad(std::string message) { return Status(StatusCode::kInvalidValue, std::move(message)); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// application/x-www-form-urlencoded value: %XX and '+' for a space.
Status percent_decode(std::string_view name, std::string_view text, std::string* out) {
  out->clear();
  out->reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out->push_back(' ');
    } else if (text[i] == '%') {
      const int hi = i + 2 < text.size() ? hex_value(text[i + 1]) : -1;
      const int lo = i + 2 < text.size() ? hex_value(text[i + 2]) : -1;
      if (i + 2 >= text.size() || hi < 0 || lo < 0) {
        return bad(std::string(name) + ": bad percent-encoding");
      }
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out->push_back(text[i]);
    }
  }
  return Status::ok();
}

Status parse_tokens(std::string_view text, std::vector<uint32_t>* out) {
  if (text.empty()) return bad("tokens: empty; expected comma-separated token ids, e.g. tokens=1,2,3");
  out->clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(start, comma - start);
    if (out->size() == kMaxDebugCacheTokens) {
      return bad("tokens: more than " + std::to_string(kMaxDebugCacheTokens) + " token ids");
    }
    uint32_t value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      const std::string shown(item.substr(0, 32));
      return bad("tokens[" + std::to_string(out->size()) + "]: '" + shown +
                 "' is not an integer 0..4294967295");
    }
    out->push_back(value);
    start = comma + 1;
  }
  return Status::ok();
}

}  // namespace

Status parse_debug_cache_query(std::string_view query, DebugCacheQuery* out) {
  DebugCacheQuery parsed;
  bool has_tokens = false;
  size_t start = 0;
  while (start < query.size()) {
    size_t amp = query.find('&', start);
    if (amp == std::string_view::npos) amp = query.size();
    const std::string_view pair = query.substr(start, amp - start);
    start = amp + 1;
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string_view name = pair.substr(0, eq);
    const std::string_view raw = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    std::string value;
    if (name == "tokens") {
      if (has_tokens) return bad("tokens: given twice");
      has_tokens = true;
      if (Status s = percent_decode(name, raw, &value); !s) return s;
      if (Status s = parse_tokens(value, &parsed.tokens); !s) return s;
    } else if (name == "lora") {
      if (parsed.lora) return bad("lora: given twice");
      if (Status s = percent_decode(name, raw, &value); !s) return s;
      if (value.size() > kMaxLoraBytes) {
        return bad("lora: " + std::to_string(value.size()) + " bytes, limit " + std::to_string(kMaxLoraBytes));
      }
      parsed.lora = std::move(value);
    } else {
      return bad("unknown parameter '" + std::string(name.substr(0, 32)) + "' (expected tokens, lora)");
    }
  }
  if (!has_tokens) return bad("tokens: missing; expected ?tokens=1,2,3[&lora=NAME]");
  *out = std::move(parsed);
  return Status::ok();
}

http::Response debug_cache_response(std::string_view query, const cache::BlockIndex* index) {
  if (index == nullptr) {
    return http::error_response(404, "the KV events index is off (kv_events.enabled: false)",
                                "not_found_error", "kv_events_disabled");
  }
  DebugCacheQuery q;
  if (Status s = parse_debug_cache_query(query, &q); !s) {
    return http::error_response(400, s.message(), "invalid_request_error", "bad_tokens");
  }
  std::optional<std::string_view> lora;
  if (q.lora) lora = *q.lora;
  nlohmann::json nodes = nlohmann::json::array();
  for (const cache::PrefixMatch& m : index->longest_prefix(q.tokens, lora)) {
    nodes.push_back({{"node", m.node},
                     {"matched_blocks", m.matched_blocks},
                     {"gpu_blocks", m.gpu_blocks},
                     {"block_size", m.block_size},
                     {"matched_tokens", uint64_t{m.matched_blocks} * m.block_size},
                     {"cached_tokens", m.cached_tokens()}});
  }
  const nlohmann::json doc = {{"tokens", q.tokens.size()},
                              {"lora", q.lora ? nlohmann::json(*q.lora) : nlohmann::json()},
                              {"lora_known", q.lora && index->knows_lora(*q.lora)},
                              {"index_entries", index->stats().entries},
                              {"nodes", std::move(nodes)}};
  return http::Response::json(200, doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace pdr::router
