#include "node/sim/messages.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;

std::string event(const json& data) {
  return "event: " + data["type"].get<std::string>() + "\ndata: " + data.dump() + "\n\n";
}

// "max_tokens" when the output hit max_tokens (chat's finish_reason "length"), as vLLM maps it.
const char* stop_reason(bool stopped) { return stopped ? "end_turn" : "max_tokens"; }

json usage(const GenerationRequest& req, size_t output_tokens) {
  return json{{"input_tokens", req.prompt_tokens}, {"output_tokens", output_tokens}};
}

const char* vllm_error_type(int status) {
  return status == 404 ? "NotFoundError" : status >= 500 ? "InternalServerError" : "BadRequestError";
}

json anthropic_error(const char* type, const std::string& message) {
  return json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

}  // namespace

std::string messages_full(const GenerationRequest& req, const std::string& id, const std::vector<std::string>& tokens,
                          bool stopped, const json& kv_params) {
  std::string text;
  for (const std::string& t : tokens) text += t;
  json body{{"id", id},
            {"type", "message"},
            {"role", "assistant"},
            {"content", json::array({json{{"type", "text"}, {"text", text}}})},
            {"model", req.model},
            {"stop_reason", stop_reason(stopped)},
            {"usage", usage(req, tokens.size())}};
  if (!kv_params.is_null()) body["kv_transfer_params"] = kv_params;
  return body.dump();
}

std::string messages_open_events(const GenerationRequest& req, const std::string& id) {
  const json message{{"id", id},
                     {"type", "message"},
                     {"role", "assistant"},
                     {"content", json::array()},
                     {"model", req.model},
                     {"stop_reason", nullptr},
                     {"stop_sequence", nullptr},
                     {"usage", usage(req, 0)}};
  std::string out = event(json{{"type", "message_start"}, {"message", message}});
  out += event(json{{"type", "content_block_start"}, {"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}});
  out += event(json{{"type", "ping"}});
  return out;
}

std::string messages_delta_event(const std::string& token) {
  return event(json{{"type", "content_block_delta"}, {"index", 0}, {"delta", {{"type", "text_delta"}, {"text", token}}}});
}

std::string messages_close_events(const GenerationRequest& req, size_t output_tokens, bool stopped) {
  std::string out = event(json{{"type", "content_block_stop"}, {"index", 0}});
  out += event(json{{"type", "message_delta"},
                    {"delta", {{"stop_reason", stop_reason(stopped)}}},
                    {"usage", usage(req, output_tokens)}});
  out += event(json{{"type", "message_stop"}});
  return out;
}

std::string sim_error_body(std::string_view path, const SimError& error) {
  if (path != kSimMessagesPath && path != kSimCountTokensPath) return vllm_error_body(error);
  return anthropic_error(vllm_error_type(error.status), error.message).dump();
}

std::string messages_error_event(const SimError& error) {
  return event(anthropic_error("internal_error", error.message));
}

std::optional<SimError> sim_count_tokens(const json& body, const AuxContext& ctx, std::string* out) {
  if (!body.is_object()) return SimError{400, "bad_json", "request body must be a JSON object"};
  if (!body.contains("model") || !body["model"].is_string()) {
    return SimError{400, "bad_model", "model is required and must be a string"};
  }
  // The Messages request's checks, with a max_tokens of its own (count_tokens takes none).
  json request = body;
  request["max_tokens"] = 1;
  GenerationRequest parsed;
  if (auto e = parse_generation_request(ApiKind::kMessages, request, ctx.served_model, &parsed)) return e;
  *out = json{{"input_tokens", parsed.prompt_tokens},
              {"context_management", {{"original_input_tokens", parsed.prompt_tokens}}}}
             .dump();
  return std::nullopt;
}

}  // namespace pdr::node::sim
