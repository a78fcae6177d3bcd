#include "node/sim/responses.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;

constexpr uint64_t kOpenEvents = 4;  // created, in_progress, output_item.added, content_part.added

std::string message_id(const std::string& id) { return "msg_" + id; }

json text_part(const std::string& text) {
  return json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", nullptr}};
}

json message_item(const std::string& id, const std::string& text, const char* status) {
  return json{{"id", message_id(id)},
              {"type", "message"},
              {"role", "assistant"},
              {"status", status},
              {"content", text.empty() && std::string(status) == "in_progress" ? json::array()
                                                                              : json::array({text_part(text)})}};
}

json response_object(const GenerationRequest& req, const std::string& id, int64_t created, const char* status,
                     json output, const json* usage, const json& kv_params) {
  json r{{"id", id},
         {"object", "response"},
         {"created_at", created},
         {"model", req.model},
         {"status", status},
         {"incomplete_details", nullptr},
         {"output", std::move(output)},
         {"max_output_tokens", req.max_tokens},
         {"parallel_tool_calls", true},
         {"tool_choice", "auto"},
         {"tools", json::array()},
         {"temperature", 1.0},
         {"top_p", 1.0},
         {"background", false},
         {"service_tier", "auto"},
         {"truncation", "disabled"},
         {"usage", usage != nullptr ? *usage : json(nullptr)}};
  if (std::string(status) == "incomplete") r["incomplete_details"] = json{{"reason", "max_output_tokens"}};
  r["kv_transfer_params"] = kv_params;
  return r;
}

json usage_of(const GenerationRequest& req, size_t output_tokens) {
  const auto out = static_cast<uint32_t>(output_tokens);
  return json{{"input_tokens", req.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", 0}}},
              {"output_tokens", out},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", req.prompt_tokens + out}};
}

std::string joined(const std::vector<std::string>& tokens) {
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

// "incomplete" when the output hit max_output_tokens (finish_reason "length"), as vLLM reports.
const char* final_status(bool stopped) { return stopped ? "completed" : "incomplete"; }

std::string event(json data, uint64_t sequence_number) {
  data["sequence_number"] = sequence_number;
  const std::string type = data["type"].get<std::string>();
  return "event: " + type + "\ndata: " + data.dump() + "\n\n";
}

}  // namespace

std::string responses_full(const GenerationRequest& req, const std::string& id, int64_t created,
                           const std::vector<std::string>& tokens, bool stopped, const json& kv_params) {
  const json usage = usage_of(req, tokens.size());
  return response_object(req, id, created, final_status(stopped),
                         json::array({message_item(id, joined(tokens), "completed")}), &usage, kv_params)
      .dump();
}

std::string responses_open_events(const GenerationRequest& req, const std::string& id, int64_t created) {
  const json in_progress = response_object(req, id, created, "in_progress", json::array(), nullptr, nullptr);
  std::string out;
  out += event(json{{"type", "response.created"}, {"response", in_progress}}, 0);
  out += event(json{{"type", "response.in_progress"}, {"response", in_progress}}, 1);
  out += event(json{{"type", "response.output_item.added"},
                    {"output_index", 0},
                    {"item", message_item(id, "", "in_progress")}},
               2);
  out += event(json{{"type", "response.content_part.added"},
                    {"item_id", message_id(id)},
                    {"output_index", 0},
                    {"content_index", 0},
                    {"part", text_part("")}},
               3);
  return out;
}

std::string responses_delta_event(const std::string& id, const std::string& token, size_t index) {
  return event(json{{"type", "response.output_text.delta"},
                    {"item_id", message_id(id)},
                    {"output_index", 0},
                    {"content_index", 0},
                    {"delta", token},
                    {"logprobs", json::array()}},
               kOpenEvents + index);
}

std::string responses_close_events(const GenerationRequest& req, const std::string& id, int64_t created,
                                   const std::vector<std::string>& tokens, bool stopped, const json& kv_params) {
  const std::string text = joined(tokens);
  uint64_t seq = kOpenEvents + tokens.size();
  std::string out;
  out += event(json{{"type", "response.output_text.done"},
                    {"item_id", message_id(id)},
                    {"output_index", 0},
                    {"content_index", 0},
                    {"text", text},
                    {"logprobs", json::array()}},
               seq++);
  out += event(json{{"type", "response.content_part.done"},
                    {"item_id", message_id(id)},
                    {"output_index", 0},
                    {"content_index", 0},
                    {"part", text_part(text)}},
               seq++);
  out += event(json{{"type", "response.output_item.done"},
                    {"output_index", 0},
                    {"item", message_item(id, text, "completed")}},
               seq++);
  const json usage = usage_of(req, tokens.size());
  out += event(json{{"type", "response.completed"},
                    {"response", response_object(req, id, created, final_status(stopped),
                                                 json::array({message_item(id, text, "completed")}), &usage,
                                                 kv_params)}},
               seq++);
  return out;
}

}  // namespace pdr::node::sim
