#include "node/sim/faults.h"

#include <nlohmann/json.hpp>

namespace pdr::node::sim {
namespace {

using nlohmann::json;

constexpr int64_t kMaxDelayMs = 600000;
constexpr int64_t kMaxCloseAfterTokens = 1000000;

// Integers only: JSON 1.0 or "1" is a caller mistake worth reporting, not something to coerce.
std::optional<std::string> read_int(const json& body, const char* key, int64_t min, int64_t max,
                                    int64_t* out) {
  const json& value = body.at(key);
  if (!value.is_number_integer()) return std::string(key) + " must be an integer";
  // Unsigned values above int64's range arrive as number_unsigned; compare before converting.
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(max)) {
    return std::string(key) + " must be in " + std::to_string(min) + ".." + std::to_string(max);
  }
  const int64_t v = value.get<int64_t>();
  if (v < min || v > max) {
    return std::string(key) + " must be in " + std::to_string(min) + ".." + std::to_string(max);
  }
  *out = v;
  return std::nullopt;
}

std::optional<std::string> read_true(const json& body, const char* key, bool* out) {
  const json& value = body.at(key);
  if (!value.is_boolean()) return std::string(key) + " must be a boolean";
  *out = value.get<bool>();
  return std::nullopt;
}

}  // namespace

bool FaultSpec::matches(std::string_view request_path) const {
  if (path) return request_path == *path;
  return request_path == "/v1/completions" || request_path == "/v1/chat/completions";
}

std::string FaultSpec::to_json() const {
  json out = json::object();
  switch (action) {
    case Action::kNone: break;
    case Action::kStatus: out["status"] = status; break;
    case Action::kHang: out["hang"] = true; break;
    case Action::kCloseAfterTokens: out["close_after_tokens"] = close_after_tokens; break;
    case Action::kCloseImmediately: out["close_immediately"] = true; break;
    case Action::kStopAfterFirstToken: out["stop_after_first_token"] = true; break;
  }
  if (delay_ms > 0) out["delay_ms"] = delay_ms;
  if (path) out["path"] = *path;
  return out.dump();
}

std::optional<std::string> parse_fault(std::string_view body, FaultSpec* out) {
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return "fault body is not valid JSON";
  if (!doc.is_object()) return "fault body must be a JSON object";
  FaultSpec fault;
  int actions = 0;
  bool has_delay = false;
  for (const auto& [key, value] : doc.items()) {
    std::optional<std::string> error;
    if (key == "status") {
      int64_t v = 0;
      error = read_int(doc, "status", 400, 599, &v);
      fault.status = static_cast<int>(v);
      fault.action = FaultSpec::Action::kStatus;
      ++actions;
    } else if (key == "hang" || key == "close_immediately" || key == "stop_after_first_token") {
      bool on = false;
      error = read_true(doc, key.c_str(), &on);
      if (!error && on) {
        fault.action = key == "hang"                ? FaultSpec::Action::kHang
                       : key == "close_immediately" ? FaultSpec::Action::kCloseImmediately
                                                    : FaultSpec::Action::kStopAfterFirstToken;
        ++actions;
      }
    } else if (key == "close_after_tokens") {
      int64_t v = 0;
      error = read_int(doc, "close_after_tokens", 0, kMaxCloseAfterTokens, &v);
      fault.close_after_tokens = static_cast<uint32_t>(v);
      fault.action = FaultSpec::Action::kCloseAfterTokens;
      ++actions;
    } else if (key == "delay_ms") {
      int64_t v = 0;
      error = read_int(doc, "delay_ms", 0, kMaxDelayMs, &v);
      fault.delay_ms = static_cast<uint32_t>(v);
      has_delay = true;
    } else if (key == "count") {
      error = read_int(doc, "count", -1, INT64_MAX, &fault.count);
      if (!error && fault.count == 0) error = "count must be -1 (until cleared) or at least 1";
    } else if (key == "path") {
      if (!value.is_string()) {
        error = "path must be a string";
      } else {
        std::string path = value.get<std::string>();
        if (!path.starts_with("/")) {
          error = "path must start with '/'";
        } else if (path.starts_with("/sim/")) {
          error = "path must not be a /sim/ test endpoint";
        }
        fault.path = std::move(path);
      }
    } else {
      error = "unknown key '" + key +
              "' (expected status, hang, close_after_tokens, close_immediately, "
              "stop_after_first_token, delay_ms, count, path)";
    }
    if (error) return error;
  }
  if (actions > 1) {
    return "status, hang, close_after_tokens, close_immediately and stop_after_first_token are "
           "mutually exclusive";
  }
  if (actions == 0 && !has_delay) {
    return "a fault needs one of status, hang, close_after_tokens, close_immediately, "
           "stop_after_first_token or delay_ms";
  }
  *out = std::move(fault);
  return std::nullopt;
}

void FaultQueue::push(FaultSpec fault) {
  std::lock_guard<std::mutex> lock(mutex_);
  faults_.push_back(std::move(fault));
}

void FaultQueue::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  faults_.clear();
}

size_t FaultQueue::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return faults_.size();
}

std::optional<FaultSpec> FaultQueue::take(std::string_view request_path) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (!it->matches(request_path)) continue;
    FaultSpec taken = *it;
    if (it->count > 0 && --it->count == 0) faults_.erase(it);
    return taken;
  }
  return std::nullopt;
}

std::string FaultQueue::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  json list = json::array();
  for (const FaultSpec& f : faults_) {
    json entry = json::parse(f.to_json());
    entry["count"] = f.count;
    list.push_back(std::move(entry));
  }
  return json{{"faults", list}}.dump();
}

}  // namespace pdr::node::sim
