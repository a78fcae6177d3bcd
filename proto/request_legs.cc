#include "proto/request_legs.h"

#include <cstdint>
#include <string>

#include "proto/base/ascii.h"
#include "proto/anthropic_messages.h"
#include "proto/dialects/dialect.h"
#include "proto/dialects/leg_edits.h"
#include "proto/generate_request.h"
#include "proto/responses_legs.h"

namespace pdr::proto {
namespace {

// Validates the token-count fields the builders read or rewrite: integer or null.
Status check_token_fields(const JsonObjectBody& body) {
  for (std::string_view key : {"max_tokens", "max_completion_tokens"}) {
    if (body.is_null(key)) continue;
    std::optional<int64_t> v;
    Status st = body.get_int(key, &v);
    if (!st) return st;
  }
  return Status::ok();
}

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// Header storage of legs gone (~LegRequest), kept per thread for the next legs built on it: a
// leg's header strings ("application/json", the request id) and its vector are longer than a
// string's inline buffer, so each would be an allocation per leg. Bounded: beyond the caps, or
// for unusually long strings, storage is freed as usual.
// Set when the thread's spares are destroyed (thread exit): a leg destroyed later on that thread
// (held by another thread_local or static object) frees its storage as usual.
thread_local bool header_spares_gone = false;

struct HeaderSpares {
  static constexpr size_t kMaxLists = 256, kMaxEntries = 1024, kMaxEntryBytes = 512;
  ~HeaderSpares() { header_spares_gone = true; }
  std::vector<HeaderList> lists;
  HeaderList entries;
};

// The calling thread's spares; null once they are destroyed.
HeaderSpares* header_spares() {
  if (header_spares_gone) return nullptr;
  thread_local HeaderSpares spares;
  return &spares;
}

// Appends name: value (value_rest appended to value), in a spare entry when there is one.
void add_header(HeaderList& headers, std::string_view name, std::string_view value,
                std::string_view value_rest = {}) {
  HeaderSpares* spares = header_spares();
  if (spares == nullptr || spares->entries.empty()) {
    headers.emplace_back();
  } else {
    headers.push_back(std::move(spares->entries.back()));
    spares->entries.pop_back();
  }
  auto& [n, v] = headers.back();
  n.assign(name);
  v.reserve(value.size() + value_rest.size());
  v.assign(value);
  v.append(value_rest);
}

void add_common_headers(const ClientRequest& request, const LegOptions& options,
                        const std::string& request_id, LegRequest* leg) {
  // The paths build_legs serves, as static text (no copy per leg).
  leg->path = request.path == "/v1/completions" ? std::string_view("/v1/completions")
              : request.path == kGeneratePath  ? kGeneratePath
              : request.path == kResponsesPath ? kResponsesPath
              : request.path == kMessagesPath  ? kMessagesPath
                                               : std::string_view("/v1/chat/completions");
  HeaderSpares* spares = header_spares();
  if (leg->headers.capacity() == 0 && spares != nullptr && !spares->lists.empty()) {
    leg->headers = std::move(spares->lists.back());
    spares->lists.pop_back();
  }
  leg->headers.reserve(4);
  add_header(leg->headers, "Content-Type", "application/json");
  if (options.upstream_api_key) {
    add_header(leg->headers, "Authorization", "Bearer ", *options.upstream_api_key);
  } else if (options.forward_client_authorization && !request.authorization.empty()) {
    add_header(leg->headers, "Authorization", request.authorization);
  }
  add_header(leg->headers, "X-Request-Id", request_id);
}

void add_dp_rank_header(const LegInstance& inst, std::optional<uint32_t> rank, LegRequest* leg) {
  if (rank && inst.dp_size > 1) add_header(leg->headers, "X-data-parallel-rank", std::to_string(*rank));
}

}  // namespace

LegRequest::~LegRequest() {
  if (headers.capacity() == 0) return;
  HeaderSpares* spares = header_spares();
  if (spares == nullptr) return;
  for (auto& entry : headers) {
    if (spares->entries.size() >= HeaderSpares::kMaxEntries) break;
    if (entry.first.capacity() + entry.second.capacity() > HeaderSpares::kMaxEntryBytes) continue;
    spares->entries.push_back(std::move(entry));
  }
  headers.clear();
  if (spares->lists.size() < HeaderSpares::kMaxLists) spares->lists.push_back(std::move(headers));
}


const std::string* LegRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return &v;
  }
  return nullptr;
}

Uuid4 make_uuid4(const RandomSource& random) {
  Uuid4 u;
  const uint64_t hi = random();
  const uint64_t lo = random();
  for (int i = 0; i < 8; ++i) {
    u.bytes[i] = static_cast<uint8_t>(hi >> (56 - 8 * i));
    u.bytes[8 + i] = static_cast<uint8_t>(lo >> (56 - 8 * i));
  }
  u.bytes[6] = static_cast<uint8_t>((u.bytes[6] & 0x0F) | 0x40);  // version 4
  u.bytes[8] = static_cast<uint8_t>((u.bytes[8] & 0x3F) | 0x80);  // RFC 4122 variant
  return u;
}

namespace {

// Lowercase hex of bytes [from, to) of the uuid, appended.
char* put_hex(const Uuid4& u, size_t from, size_t to, char* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = from; i < to; ++i) {
    *out++ = kHex[u.bytes[i] >> 4];
    *out++ = kHex[u.bytes[i] & 0xF];
  }
  return out;
}

}  // namespace

std::string Uuid4::hex() const {
  std::string out(32, '\0');
  put_hex(*this, 0, 16, out.data());
  return out;
}

std::string Uuid4::dashed() const {
  std::string out(36, '-');
  char* p = out.data();
  p = put_hex(*this, 0, 4, p) + 1;
  p = put_hex(*this, 4, 6, p) + 1;
  p = put_hex(*this, 6, 8, p) + 1;
  p = put_hex(*this, 8, 10, p) + 1;
  put_hex(*this, 10, 16, p);
  return out;
}

std::string make_addressed_request_id(std::string_view prefill_zmq, std::string_view decode_zmq,
                                      const Uuid4& uuid) {
  constexpr std::string_view kPrefill = "___prefill_addr_", kDecode = "___decode_addr_";
  std::string id;
  id.reserve(kPrefill.size() + prefill_zmq.size() + kDecode.size() + decode_zmq.size() + 1 + 32);
  id.append(kPrefill);
  id.append(prefill_zmq);
  id.append(kDecode);
  id.append(decode_zmq);
  id.push_back('_');
  const size_t hex_at = id.size();
  id.resize(hex_at + 32);
  put_hex(uuid, 0, 16, id.data() + hex_at);
  return id;
}

std::string http_origin(std::string_view host, uint16_t port) {
  return "http://" + dialects::bracket_host(host) + ":" + std::to_string(port);
}

Status build_legs(const ClientRequest& request, const LegInstance& p, const LegInstance& d,
                  std::optional<uint32_t> p_rank, std::optional<uint32_t> d_rank,
                  const LegOptions& options, const RandomSource& random, LegBuild* out) {
  *out = LegBuild();
  const bool tokens_in = request.path == kGeneratePath;
  const bool responses = request.path == kResponsesPath;
  const bool messages = request.path == kMessagesPath;
  if (request.path != "/v1/completions" && request.path != "/v1/chat/completions" && !tokens_in && !responses &&
      !messages) {
    return Status(StatusCode::kNotFound, "P/D routing serves /v1/completions, /v1/chat/completions, "
                                         "/v1/responses, /v1/messages and /inference/v1/generate only, not " +
                                             std::string(request.path.substr(0, 64)));
  }
  if (p.connector != d.connector) {
    return Status(StatusCode::kRejected, "prefill connector " + std::string(to_string(p.connector)) +
                                             " does not match decode connector " +
                                             std::string(to_string(d.connector)));
  }
  if (p.connector == Connector::kUnknown) {
    return Status(StatusCode::kRejected, "connector dialect of the pair is unknown");
  }
  if (p_rank && *p_rank >= p.dp_size) {
    return Status(StatusCode::kOutOfRange, "prefill DP rank " + std::to_string(*p_rank) +
                                               " is not below its dp_size " +
                                               std::to_string(p.dp_size));
  }
  if (d_rank && *d_rank >= d.dp_size) {
    return Status(StatusCode::kOutOfRange, "decode DP rank " + std::to_string(*d_rank) +
                                               " is not below its dp_size " +
                                               std::to_string(d.dp_size));
  }

  const JsonObjectBody* client = request.parsed;
  JsonObjectBody parsed_here;
  if (client == nullptr) {
    if (Status st = JsonObjectBody::parse(request.body, options.limits, &parsed_here); !st) return st;
    client = &parsed_here;
  }
  // Tokens in: the caller's check of its parse (ClientRequest::generate), else one made here.
  const GenerateView* generate = request.parsed != nullptr ? request.generate : nullptr;
  GenerateView checked_here;  // borrows *client's document, which outlives it
  if (tokens_in) {
    if (generate == nullptr) {
      if (Status st = check_generate_request(*client, options.limits, &checked_here); !st) return st;
      generate = &checked_here;
    }
  } else if (messages) {  // its one cap is max_tokens (proto/anthropic_messages.h)
    if (Status st = check_messages_request(*client); !st) return st;
  } else if (Status st = check_token_fields(*client); !st) {
    return st;
  } else if (responses) {
    if (Status st = check_responses_fields(*client); !st) return st;
  }
  const Dialect* dialect = dialect_for(p.connector, p.transfer_mode);
  if (dialect == nullptr) {
    return Status(StatusCode::kRejected,
                  "no connector dialect for " + std::string(to_string(p.connector)) + " with transfer mode " +
                      std::string(to_string(p.transfer_mode)) + " (MoRIIO needs READ or WRITE)");
  }
  if (const std::string_view why = unsupported_endpoint(*dialect, request.path); !why.empty()) {
    return Status(StatusCode::kRejected, std::string(why));
  }
  LegPlan& plan = out->plan;
  plan.dialect = dialect;
  plan.connector = p.connector;
  plan.transfer_mode = p.transfer_mode;
  plan.concurrent = dialect->concurrent;
  plan.decode_needs_prefill_params = dialect->decode_needs_prefill_params;
  plan.prefill_host = p.http_address.host;
  plan.decode_host = d.http_address.host;
  out->prefill.body = *client;  // shares the client's bytes; the dialect adds its edits
  out->decode.body = *client;
  plan.tokens_in = tokens_in;
  if (tokens_in) {  // the dialect edits token counts at the top level (generate_request.h)
    generate_leg_view(*generate, &out->prefill.body);
    generate_leg_view(*generate, &out->decode.body);
  }
  if (messages) {
    // No field of Anthropic's API (vLLM ignores it there), but the dialects would cap or
    // decrement it instead of max_tokens (MoRIIO's decode would then ask for one token too many).
    out->prefill.body.remove("max_completion_tokens");
    out->decode.body.remove("max_completion_tokens");
  }
  const DialectInput input{p, d, p_rank, options, random};
  if (Status st = dialect->build(input, &plan, &out->prefill.body, &out->decode.body); !st) return st;
  if (tokens_in) {
    finish_generate_leg(*client, *generate, &out->prefill.body);
    finish_generate_leg(*client, *generate, &out->decode.body);
  }
  if (responses) respell_prefill_for_responses(*client, &out->prefill.body);

  add_common_headers(request, options, plan.request_id, &out->prefill);
  add_common_headers(request, options, plan.request_id, &out->decode);
  add_dp_rank_header(p, p_rank, &out->prefill);
  add_dp_rank_header(d, d_rank, &out->decode);
  return Status::ok();
}

Status finish_decode_leg(const LegPlan& plan, LegRequest* decode,
                         std::string_view prefill_response_json, const JsonLimits& limits) {
  if (plan.dialect == nullptr || plan.dialect->finish_decode == nullptr) return Status::ok();

  // Both parses borrow the answer's bytes: nothing read from them outlives this function (the
  // values the dialect copies into the decode body are copied there). The two bodies are the
  // thread's own, reused (their tables allocate nothing once grown), and emptied on return.
  thread_local JsonObjectBody response, params;
  struct EmptiedOnReturn {
    ~EmptiedOnReturn() {
      response.clear();
      params.clear();
    }
  } emptied;
  if (Status st = JsonObjectBody::parse_borrowed(prefill_response_json, limits, &response); !st) {
    return Status(st.code(), "prefill response: " + st.message());
  }
  const auto raw = response.get_raw("kv_transfer_params");
  if (!raw || *raw == "null") {
    return Status(StatusCode::kMissingKey,
                  "prefill response has no kv_transfer_params (prefill did not export KV, e.g. "
                  "it stopped before the length cap)");
  }
  if (raw->front() != '{') {
    return Status(StatusCode::kWrongType, "prefill response kv_transfer_params is not an object");
  }
  // A value of the answer just validated: indexed only, not validated a second time.
  if (Status st = JsonObjectBody::parse_member_borrowed(*raw, limits, &params); !st) {
    return Status(st.code(), "prefill response kv_transfer_params: " + st.message());
  }
  if (params.size() == 0) {
    return Status(StatusCode::kMissingKey, "prefill response kv_transfer_params is empty");
  }
  // In place: the dialect leaves the body unchanged when it fails (dialect.h).
  Status st = plan.dialect->finish_decode(plan, *raw, params, limits, &decode->body);
  if (st.is_ok() && plan.tokens_in) st = mirror_generate_kv_params(limits, &decode->body);
  return st;
}

std::string_view unsupported_endpoint(const Dialect& dialect, std::string_view path) {
  if (path == kGeneratePath) return dialect.tokens_in_unsupported;
  if (path == kMessagesPath) return dialect.messages_unsupported;
  return {};
}

bool decode_without_kv(const LegPlan& plan, LegRequest* decode) {
  if (plan.dialect == nullptr || plan.dialect->without_kv == nullptr) return false;
  plan.dialect->without_kv(&decode->body);
  // Only fails on a body build_legs did not check (the view of sampling_params it made is valid).
  if (plan.tokens_in) (void)mirror_generate_kv_params(JsonLimits(), &decode->body);
  return true;
}

}  // namespace pdr::proto
