#include "proto/mooncake_query.h"

#include <simdjson.h>

#include <charconv>
#include <map>

namespace pdr::proto {

namespace {
constexpr size_t kMaxQueryBytes = 1024 * 1024;
constexpr uint32_t kMaxRanks = 4096;
}  // namespace

Status parse_mooncake_query(std::string_view json, MooncakeEngines* out) {
  if (json.size() > kMaxQueryBytes) {
    return Status(StatusCode::kTooLarge, "bootstrap /query answer over " + std::to_string(kMaxQueryBytes) + " bytes");
  }
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(json.data(), json.size()).get(root); err != simdjson::SUCCESS) {
    return Status(StatusCode::kMalformed, std::string("bootstrap /query answer is not JSON: ") +
                                              simdjson::error_message(err));
  }
  simdjson::dom::object object;
  if (root.get_object().get(object) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, "bootstrap /query answer is not a JSON object");
  }
  std::map<uint32_t, std::string> by_rank;
  for (auto field : object) {
    const std::string_view key = field.key;
    uint32_t rank = 0;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), rank);
    if (ec != std::errc() || end != key.data() + key.size() || key.empty() || rank >= kMaxRanks) {
      return Status(StatusCode::kInvalidValue, "bootstrap /query: key '" + std::string(key) + "' is not a DP rank");
    }
    simdjson::dom::object entry;
    if (field.value.get_object().get(entry) != simdjson::SUCCESS) {
      return Status(StatusCode::kWrongType, "bootstrap /query: rank " + std::string(key) + " is not an object");
    }
    simdjson::dom::element engine;
    if (entry.at_key("engine_id").get(engine) != simdjson::SUCCESS) {
      return Status(StatusCode::kMissingKey, "bootstrap /query: rank " + std::string(key) + " has no engine_id");
    }
    std::string_view engine_id;
    if (engine.get_string().get(engine_id) != simdjson::SUCCESS) {
      return Status(StatusCode::kWrongType, "bootstrap /query: rank " + std::string(key) + " engine_id is not a string");
    }
    by_rank[rank] = std::string(engine_id);
  }
  if (by_rank.empty()) return Status(StatusCode::kInvalidValue, "bootstrap /query: no engine registered yet");
  MooncakeEngines engines;
  for (const auto& [rank, id] : by_rank) {
    if (rank != engines.engine_ids.size()) {
      return Status(StatusCode::kInvalidValue,
                    "bootstrap /query: DP rank " + std::to_string(engines.engine_ids.size()) + " is missing");
    }
    engines.engine_ids.push_back(id);
  }
  *out = std::move(engines);
  return Status::ok();
}

}  // namespace pdr::proto
