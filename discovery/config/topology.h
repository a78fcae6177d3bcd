// The deployment as the operator describes it in YAML, validated into plain structs once.
// Only topology_loader.cc and yaml_reader.{h,cc} touch yaml-cpp. Every field has a default, so an
// empty file is a valid topology. Reference: deploy/topology.example.yaml (every key commented).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "discovery/config/admission.h"
#include "discovery/config/client_key_file.h"
#include "proto/curve_keys.h"
#include "proto/address.h"
#include "proto/discovery_message.h"
#include "proto/k8s_label_selector.h"
#include "proto/node_spec.h"
#include "proto/base/status.h"

namespace pdr::config {

enum class PolicyName : uint8_t { kRoundRobin, kLeastOutstanding, kPowerOfTwo, kAffinity, kCacheAware, kPredictedLatency };
// "round_robin", "least_outstanding", "power_of_two", "affinity", "cache_aware", "predicted_latency"
std::string_view to_string(PolicyName);
bool parse_policy_name(std::string_view, PolicyName*);

// A node the operator describes (topology `instances:`, POST /admin/instances): connector defaults
// to connectors.default; zmq_address is optional and validated per connector (instance_spec.h);
// the parsed forms of zmq_address are left unset (the registry fills them).
using StaticInstance = proto::NodeSpec;

// 127.0.0.0/8 and ::1: the default discovery allow list (one machine, as the quick start runs).
AllowList loopback_allow_list();
// True for tcp:// endpoints bound to a loopback address, and for ipc://.
bool endpoint_is_local(std::string_view zmq_endpoint);

// TLS on one of pdrouter's listeners (listeners.tls, listeners.admin_tls; router/http/tls_server.h):
// TLS 1.2+, ALPN http/1.1. The PEM files are read at every load (size-capped, checked to hold PEM),
// so a reload (SIGHUP, or a change of the topology file) picks up renewed certificates: new
// handshakes use them, open connections keep theirs. Turning TLS on or off needs a restart.
struct ListenerTls {
  std::string cert_file;  // the chain: leaf first, then intermediates
  std::string cert_pem;
  std::string key_file;
  std::string key_pem;  // secret
  // Set: clients must present a certificate signed by one of these CAs (mutual TLS).
  std::string client_ca_file;
  std::string client_ca_pem;
  bool enabled() const { return !cert_file.empty(); }
  bool operator==(const ListenerTls&) const = default;
};

// TLS on the legs to nodes (connectors.tls, and an instance's `tls` over it; router/http/tls_client.h):
// for vLLM behind --ssl-certfile (and --ssl-ca-certs with --ssl-cert-reqs 2 for mutual TLS). The
// node's certificate is always verified, for server_name or else the host of its http_address
// (a DNS name or an IP address in its subjectAltName).
struct NodeTls {
  bool enabled = false;
  std::string ca_file;  // "" = the system's CA store
  std::string ca_pem;
  std::string cert_file;  // client certificate (mutual TLS), with key_file
  std::string cert_pem;
  std::string key_file;
  std::string key_pem;  // secret
  std::string server_name;  // "" = the host of each node's http_address
  bool operator==(const NodeTls&) const = default;
};

// An instance's own TLS settings (its `tls:` in the topology), the section's merged under them.
struct NodeTlsOverride {
  proto::HostPort http_address;
  NodeTls tls;
  bool operator==(const NodeTlsOverride&) const = default;
};

struct Topology {
  std::string source_path;  // file it was loaded from ("" for defaults)

  struct Listeners {
    proto::HostPort http{"0.0.0.0", 10001};
    std::string discovery = "tcp://*:36367";  // ZMQ endpoint; "tcp://host:0" binds an ephemeral port
    // Optional second discovery endpoint speaking CURVE (needs discovery.curve.secret_key_file);
    // "" = none. Plain vLLM nodes use `discovery`, sidecars that hold keys use this one.
    std::string discovery_curve;
    // Operator listener: when set, /admin/*, /instances/add, /status, /metrics, /start_profile
    // and /stop_profile are served only here (404 on `http`). Unset: all on `http`.
    std::optional<proto::HostPort> admin;
    ListenerTls tls;        // TLS on `http` (unset: plain HTTP)
    ListenerTls admin_tls;  // TLS on `admin` (needs `admin`; client_ca_file: operators need certificates)
  } listeners;

  uint32_t workers = 0;  // HTTP worker loops; 0 = one per core

  struct Discovery {
    std::chrono::milliseconds ttl{5000};            // default instance TTL after its last message
    std::chrono::milliseconds min_ttl{1000};        // bounds for a node-requested ttl_ms
    std::chrono::milliseconds max_ttl{300000};
    std::chrono::milliseconds expired_retention{60000};  // expired entries stay visible this long
    uint32_t max_instances = 4096;
    uint32_t max_message_bytes = 64 * 1024;
    std::string auth_token;        // resolved secret ("" = no authentication)
    std::string auth_token_env;    // where it came from (for /status; never the secret itself)
    bool allow_unauthenticated_vllm = true;  // plain vLLM dialects cannot carry a token
    // Who may connect to the plain endpoint (and to the CURVE one when it has no client key
    // list), checked at the ZMQ handshake: peers elsewhere never get a message in.
    AllowList allowed_peers = loopback_allow_list();
    // Required to start when the allow list admits every address on an endpoint reachable from
    // the network: anyone who reaches the port could then register nodes that get client traffic.
    bool allow_open = false;
    // Registered entries per admission class ("open", "address", "token", "curve").
    std::array<uint32_t, kAdmissionClasses> max_instances_per_class{256, 4096, 4096, 4096};
    struct Curve {
      std::string secret_key_file;   // server key (bare Z85 secret or a ZPL certificate)
      proto::CurveKeyPair server_keys;      // resolved from secret_key_file
      std::string allowed_client_keys_file;          // one public key per line / certificates
      std::vector<std::string> allowed_client_keys;  // resolved, Z85; empty = admit by address
    } curve;
    // True when the plain endpoint (or a keyless CURVE one) admits any address from the network.
    bool open_to_network(const std::string& plain_endpoint, const std::string& curve_endpoint) const;
  } discovery;

  struct Policies {
    PolicyName prefill = PolicyName::kRoundRobin;
    PolicyName decode = PolicyName::kRoundRobin;
    std::string affinity_header;   // for kAffinity: hash this header if present
    uint32_t affinity_prefix_bytes = 256;  // else hash the first N bytes of the prompt
    // For kCacheAware (router/policies/cache_aware.h): the node holding the most of the prompt
    // wins when it holds at least min_match_percent of it, unless it is overloaded (more than
    // balance_abs_threshold requests beyond the least loaded node AND more than
    // balance_rel_percent of its load); otherwise least outstanding. Prompts with token ids are
    // matched against the nodes' KV events (kv_events:), text prompts against a prefix tree of
    // where pdrouter routed earlier prompts, bounded by prefix_tree_max_bytes of memory (its
    // nodes as allocated, not only their text; read at start) and prefix_tree_prompt_bytes per
    // prompt.
    struct CacheAware {
      uint32_t min_match_percent = 50;
      uint32_t balance_abs_threshold = 32;
      uint32_t balance_rel_percent = 150;
      uint32_t prefix_tree_max_bytes = 64u << 20;
      uint32_t prefix_tree_prompt_bytes = 256u << 10;
      // Text prompts and chat messages: `node` asks one node (labelled `serves: tokenize`, else a
      // prefill the request could pair with) for the prompt's token ids (vLLM's POST /tokenize,
      // router/routing/cache_tokenize.h) and matches them exactly on the KV events' block index;
      // `off` (default: it costs a hop) uses the prefix tree only. Any failure falls back to the
      // prefix tree.
      bool tokenize_by_node = false;
      std::chrono::milliseconds tokenize_timeout{250};   // the whole /tokenize call
      uint32_t tokenize_max_answer_bytes = 4u << 20;      // a larger /tokenize answer is dropped
      bool operator==(const CacheAware&) const = default;
    } cache_aware;
    // For kPredictedLatency (router/policies/predicted_latency.h): the candidate with the least
    // predicted TTFT (prefill) or time per output token (decode) wins. The nodes' measured
    // estimates feed it; a node without one takes the mean of those that have one, and with none
    // measured these defaults. The step-time slopes, KV transfer cost and KV capacity (per DP
    // rank) are the model's constants. slo_*: the default SLO of a request that sends no
    // x-slo-ttft-ms / x-slo-tpot-ms header (0: none); shed: a request no candidate is predicted
    // to serve within its SLO is refused at once (503, Retry-After) instead of waiting in the
    // admission queue.
    struct PredictedLatency {
      uint32_t default_prefill_tokens_per_second = 8000;
      uint32_t default_decode_step_us = 7500;
      uint32_t decode_step_us_per_sequence = 18;
      uint32_t decode_step_ns_per_kv_token = 45;
      uint32_t kv_transfer_ns_per_token = 5000;
      uint32_t kv_capacity_tokens = 464000;
      uint32_t kv_full_penalty_ms = 1000;
      // Prefill: how many seconds of other requests' waiting one second of prefill work added to
      // a node costs; the choice minimises predicted TTFT + this x the request's own prefill work
      // there (uncached tokens over the node's rate). 0: the request's own TTFT alone.
      uint32_t fleet_work_weight = 8;
      // Whose measured prefill rate a prefill's prediction uses. true (prefill_rate: node): the
      // node's own, for a fleet of unlike GPUs. false (fleet, the default): the mean of the
      // candidates' measured rates, for every candidate alike. A node's measured rate also
      // reflects its request mix (tokens computed after a long cached prefix cost more attention),
      // and identical nodes predicted at different rates steer work to the one that looks faster:
      // the goodput benchmark measured the fleet's rate ahead (bench/serving/GOODPUT_RESULTS.md).
      bool prefill_rate_per_node = false;
      // The decode nodes' --max-num-batched-tokens: a decode computing a prompt itself (serving
      // a request alone) carries a chunk of up to this many of its tokens in each step, so its
      // predicted time per output token grows by that chunk's time at the prefill rate (and
      // with slo_tpot_ms, decode_alone_when_busy keeps that within it).
      uint32_t step_token_budget = 8192;
      uint32_t slo_ttft_ms = 0;
      uint32_t slo_tpot_ms = 0;
      bool shed = false;
      bool operator==(const PredictedLatency&) const = default;
    } predicted_latency;
  } policies;

  struct Connectors {
    proto::Connector default_connector = proto::Connector::kMoriio;
    proto::TransferMode default_transfer_mode = proto::TransferMode::kWrite;
    uint16_t mooncake_bootstrap_port = 8998;
    std::string upstream_api_key;      // resolved secret sent as Authorization (replaces the client's)
    std::string upstream_api_key_env;  // its source
    NodeTls tls;  // TLS to every node (connectors.tls); off by default
    // Instances (topology `instances:`) with a `tls:` of their own, by http_address.
    std::vector<NodeTlsOverride> tls_by_node;
    // The TLS settings for the node at `http_address` (enabled false: plain HTTP).
    const NodeTls& tls_for(const proto::HostPort& http_address) const;
  } connectors;

  struct Timeouts {
    std::chrono::milliseconds connect{2000};
    std::chrono::milliseconds prefill{60000};
    std::chrono::milliseconds first_byte{60000};
    std::chrono::milliseconds stream_idle{60000};
    std::chrono::milliseconds header_read{10000};
    // A request body must arrive whole within this, counted from the end of its headers (408
    // after it), however often bytes trickle in: bounds how long a slow body holds a connection.
    std::chrono::milliseconds body_read{30000};
    std::chrono::milliseconds keep_alive_idle{60000};
    std::chrono::milliseconds drain{30000};
    // A stream paused for a client that does not read (back-pressure) is aborted, both legs
    // closed, when the client's queued bytes have not gone down for this long.
    std::chrono::milliseconds client_write{30000};
    // Whole request, admission to the last byte; 0 = no deadline. Past it: 504 request_deadline
    // (an error event if the stream began) and both legs closed.
    std::chrono::milliseconds request{0};
    // A concurrent dialect's prefill leg still open when the decode answered (an orphan) is read
    // and dropped for this long at most (or until its prefill deadline), then closed; 0 = closed
    // at once (router/proxy/orphan_legs.h).
    std::chrono::milliseconds orphan_grace{5000};
  } timeouts;

  struct Retries {
    uint32_t prefill_attempts = 2;  // total tries, >= 1
    uint32_t decode_attempts = 2;
    // Passive health (router/routing/ejection.h): a node is skipped for eject_ms after this many
    // legs in a row could not connect to it; 0 = never.
    uint32_t eject_after_connect_failures = 3;
    std::chrono::milliseconds eject{5000};
  } retries;

  struct Limits {
    uint32_t max_body_bytes = 32 * 1024 * 1024;
    uint32_t max_header_bytes = 64 * 1024;
    uint32_t max_concurrent_requests = 4096;
    // Admission queue (router/proxy/admission_queue.h): a request that finds
    // max_concurrent_requests in flight waits for a slot, ordered by priority class then
    // round-robin over tenants, instead of a 429; beyond either bound it gets the 429, after
    // queue_timeout a 503. Any of the three 0 = no queue (the 429 at once).
    uint32_t max_queued_requests = 1024;
    uint32_t max_queued_bytes = 256u << 20;  // of waiting bodies
    std::chrono::milliseconds queue_timeout{30000};
    bool queue_enabled() const {
      return max_queued_requests != 0 && max_queued_bytes != 0 && queue_timeout.count() != 0;
    }
    uint32_t max_connections = 16384;
    // Bytes of request bodies and buffered (non-stream) answers held at once by all workers
    // together; a request or an answer that would go over it is refused (503 memory_budget).
    // 0 = no budget.
    uint32_t max_buffered_bytes = 1u << 30;
    // Orphaned prefill legs (timeouts.orphan_grace) kept per prefill node, shared out over the
    // workers; a new one over it closes the node's oldest. They never count against
    // max_concurrent_requests. 0 = none kept (closed when the decode answered).
    uint32_t max_orphan_legs_per_node = 64;
  } limits;

  struct Admin {
    std::string api_key;       // resolved secret ("" = admin API disabled)
    std::string api_key_env;   // source: environment variable name
    std::string api_key_file;  // or source: file path
    bool protect_status = false;  // GET /status requires the admin key as /admin/* does
  } admin;

  // Client API keys (router/clients/client_gate.h). With keys_file set, every client endpoint but
  // /health and /ready needs one of the file's keys as `Authorization: Bearer <key>` or
  // `x-api-key: <key>` (401 otherwise), and the key names the request's tenant. The file
  // (discovery/config/client_key_file.h) is read with the topology and reread when it changes; only the
  // keys' SHA-256 digests are kept.
  struct ClientAuth {
    std::string keys_file;  // "" = no client authentication (the default)
    std::string keys_path;  // keys_file as opened (a relative one resolved beside the topology file)
    ClientKeySet keys;      // resolved from keys_file
    // With keys: the client's credential also goes on to the nodes (Authorization, or an
    // Anthropic client's x-api-key as a Bearer token) when connectors.upstream_api_key is unset.
    // Off: the nodes never see a client's key.
    bool forward_client_key = false;
    bool enabled() const { return !keys_file.empty(); }
  } client_auth;

  // Per-tenant limits (router/clients/tenant_registry.h). 0 = no limit.
  struct TenantLimits {
    uint32_t requests_per_second = 0;  // token bucket over requests passing the key check
    uint32_t burst = 0;                // requests back to back; 0 = requests_per_second
    uint32_t tokens_per_minute = 0;    // prompt + max_tokens reserved at admission, settled from usage
    uint32_t max_in_flight = 0;        // P/D and one-node requests of the tenant at once
    // Admission queue class (router/proxy/admission_queue.h): 0 (lowest) .. 7 (highest, served
    // first); a request's x-pdr-priority header may lower it. Not a limit: 4 by default.
    uint32_t priority = 4;
    bool operator==(const TenantLimits&) const = default;
  };
  struct Tenants {
    // Without client keys: the request header naming a request's tenant (lower case; "" = none:
    // every keyless request is the tenant "default"). Ignored with client keys (the key names it).
    std::string header;
    TenantLimits defaults;  // of every tenant without an entry in `limits`
    // Per tenant, sorted by name; fields not written take `defaults`' values.
    std::vector<std::pair<std::string, TenantLimits>> limits;
    const TenantLimits& limits_of(std::string_view tenant) const;
  } tenants;

  // One JSON line per client request (router/clients/access_log.h).
  struct AccessLog {
    std::string path;                  // "" = off; "stderr" = pdrouter's standard error
    uint32_t max_queued_lines = 8192;  // lines waiting for the writer; more are dropped (counted)
  } access_log;

  // Subscription to the nodes' vLLM KV cache events (router/cache/kv_events_subscriber.h).
  struct KvEvents {
    bool enabled = false;
    // A node that names no kv_events_endpoint gets tcp://<its HTTP host>:default_port; unset:
    // such a node is not subscribed to.
    std::optional<uint16_t> default_port;
    std::string topic;  // subscription prefix ("" = every topic), <= 256 bytes
    uint32_t max_index_entries = 4'000'000;  // BlockIndex budget, (node rank, block) entries
    // Allowance per node over all its DP ranks, live and replayed: batches beyond either rate are
    // discarded undecoded and that DP rank's entries dropped (pdrouter_kv_events_rate_limited_total);
    // no batch larger than max_node_bytes_per_sec is accepted at all. 1..10,000,000 and
    // 65,536..1,073,741,824.
    uint32_t max_node_batches_per_sec = 10'000;
    uint32_t max_node_bytes_per_sec = 8u << 20;
    // DP ranks of one node subscribed to (a larger dp_size: ranks 0..N-1 only, the rest counted in
    // pdrouter_kv_events_ranks_over_cap_total), 1..1024; SUB sockets over every node, 1..1,000,000
    // (and at most a quarter of the open-file limit at 4 descriptors each).
    uint32_t max_ranks_per_node = 64;
    uint32_t max_subscriptions = 1024;
  } kv_events;

  // Load signals from the nodes themselves (router/proxy/engine_load_scrape.h): with
  // scrape_engine_metrics, every routable node's GET /metrics is read every interval (one read in
  // flight per node, Bearer connectors.upstream_api_key, the node's TLS) and its
  // vllm:num_requests_running / _waiting / kv_cache_usage_perc kept beside the load ledger
  // (discovery/engine_load.h). A read not whole within timeout, over max_body_bytes, not 200, or
  // not a page with those families is a failure (pdrouter_engine_scrape_failures_total{reason});
  // figures older than stale_after are not used (the ledger alone is). Applies on reload.
  // interval 100..3,600,000 ms; timeout 10..60,000 ms and at most interval; stale_after
  // 100..86,400,000 ms and at least interval; max_body_bytes 1,024..67,108,864.
  struct LoadSignals {
    bool scrape_engine_metrics = false;
    std::chrono::milliseconds interval{1000};
    std::chrono::milliseconds timeout{500};
    std::chrono::milliseconds stale_after{3000};
    uint32_t max_body_bytes = 4u << 20;
  } load_signals;

  // Conditional disaggregation (router/routing/decode_alone.h): a request is sent to its decode
  // alone, without a prefill leg, when its prompt is short (at most max_prompt_tokens; text
  // prompts count 4 bytes of JSON text as a token) or when the chosen decode already holds at
  // least min_cached_percent of it (cache_aware's lookup), or, with predicted_latency on both
  // legs, when the prompts queued on the chosen prefill take at least prefill_busy_ms and the
  // chosen decode would answer sooner without slowing its streams (decode_alone_when_busy). Only for dialects whose decode
  // can compute a prompt itself (NIXL, MoRIIO READ). 0 turns a condition off.
  struct ConditionalDisaggregation {
    bool enabled = false;
    uint32_t max_prompt_tokens = 0;
    uint32_t min_cached_percent = 0;
    uint32_t prefill_busy_ms = 0;
  } conditional_disaggregation;

  // Multi-turn KV reuse (router/routing/conversation_cache.h; NIXL with bidirectional_kv_xfer on
  // the nodes): a request's top-level "conversation_id" is removed from its legs, the decode's
  // final kv_transfer_params are kept for the conversation (single use, for ttl), and the next
  // turn goes to that decode with a prefill that pulls the decode's blocks instead of recomputing.
  struct MultiTurn {
    bool enabled = false;
    // Below the decode's block lease (vLLM decoder_kv_blocks_ttl, 480 s by default).
    std::chrono::milliseconds ttl{450'000};
    uint32_t max_entries = 100'000;
    uint32_t max_bytes = 64u << 20;  // of cached kv_transfer_params and keys
    // Whose entry a turn may use (router/routing/conversation_binding.h): each entry belongs to a
    // digest of the client's Authorization header (kAuthorization), of the value of the header
    // `bind_header` (kHeader: a tenant header a gateway in front sets), or to nobody (kNone: one
    // shared namespace of conversation ids, for single-tenant deployments). A request without
    // that credential has the anonymous binding, shared by all such requests.
    enum class BindTo : uint8_t { kAuthorization, kHeader, kNone };
    BindTo bind_to = BindTo::kAuthorization;
    std::string bind_header;      // kHeader: the header's name, lower case
    bool allow_anonymous = true;  // false: requests with the anonymous binding get no reuse
    // HMAC-SHA256 key of the binding digests ("" = plain SHA-256). Replicas sharing entries
    // through etcd must all use the same one.
    std::string binding_secret;      // resolved secret
    std::string binding_secret_env;  // source: environment variable name
  } multi_turn;
  // Session affinity (router/routing/session_affinity.h): the turns of one client session go to
  // the prefill and decode nodes its last turn went to, while those stay routable and are not
  // overloaded. The session id is the value of the first of `headers` the request carries, else
  // the first of `fields` (top-level JSON string fields of the body) present: an exact id, at
  // most max_id_bytes of printable ASCII without spaces; any other value is counted
  // (pdrouter_session_affinity_bad_ids_total) and the request routes as if it had none. Bindings
  // belong to the client's credential as multi-turn entries do (multi_turn.bind_to, bind_header
  // and binding_secret), so one client cannot steer or read another's. At most max_sessions
  // bindings (least recently used go first), each forgotten after idle_ttl without a turn.
  // Spill: a bound node is left (and the session rebound) when its load exceeds an
  // alternative's by more than spill_margin_requests requests in flight per unit of weight
  // (dp_size), or, between prefills whose rates pdrouter has measured, by more than
  // spill_margin_queue_ms of queued uncached prompt tokens (which then decides alone). Under
  // policies.prefill: predicted_latency a bound prefill is left instead when its predicted TTFT
  // exceeds the fastest candidate's by more than spill_margin_queue_ms (the prediction counts the
  // prompt the node holds, which the queue figures cannot). With
  // registry.backend: etcd the bindings are shared with the other replicas
  // (router/session_mirror.h).
  struct SessionAffinity {
    bool enabled = false;
    // The names clients already send: a generic header, the session headers of agent clients
    // (Claude Code's among them), OpenAI's conversation_id and end-user `user` fields.
    // Lower case; at most 8.
    std::vector<std::string> headers{"x-session-affinity", "session-id", "x-claude-code-session-id"};
    std::vector<std::string> fields{"conversation_id", "user"};  // at most 8
    uint32_t max_sessions = 100'000;
    std::chrono::milliseconds idle_ttl{1'800'000};
    uint32_t max_id_bytes = 256;
    uint32_t spill_margin_requests = 4;
    std::chrono::milliseconds spill_margin_queue{2000};
  } session_affinity;
  // Endpoints that are not P/D (router/proxy/one_node_relay.h; which node serves what is the
  // node's `serves` label).
  struct Routing {
    // A path no route names is relayed to one decode node instead of the 404.
    bool pass_through_unknown = false;
    // With pass_through_unknown: the only paths relayed (empty = any path but the node admin
    // paths, router/proxy/pass_through.h). Decoded, normalised paths ("/v1/foo"); an entry
    // ending in "/**" also names every path below it. At most 256 entries.
    std::vector<std::string> pass_through_paths;
  } routing;
  // Where the registry lives (discovery/sources/etcd/registry_replicator.h). "memory": this process only
  // (the default). "etcd": replicas share it through etcd's v3 JSON gateway (plain HTTP, or TLS
  // with https:// endpoints, optionally with a client certificate).
  struct Registry {
    std::string backend = "memory";               // memory | etcd
    std::vector<proto::HostPort> etcd_endpoints;  // host:port of etcd's client URLs; etcd needs one
    std::string etcd_prefix = "/pdrouter/";       // every key pdrouter writes starts with it
    std::string replica_id;                       // "" = hostname-pid; unique per running replica
    std::chrono::seconds lease_ttl{10};           // a dead replica's entries go after this
    std::string etcd_user;                        // "" = no authentication
    std::string etcd_password;                    // resolved secret
    std::string etcd_password_env;                // source: environment variable name
    // TLS to etcd: endpoints written https://host:port (all of them, or none). The PEM files are
    // read (size-capped, checked to hold PEM) at load; their content is kept for the client.
    bool etcd_tls = false;
    std::string etcd_ca_file;    // "" = the system's CA store
    std::string etcd_ca_pem;
    std::string etcd_cert_file;  // client certificate (etcd --client-cert-auth); with etcd_key_file
    std::string etcd_cert_pem;
    std::string etcd_key_file;
    std::string etcd_key_pem;    // secret
  } registry;

  // Kubernetes pod discovery (discovery/sources/kubernetes/pod_watcher.h): pods matching label_selector in
  // `namespace` become nodes while Running and Ready with a pod IP. Off by default. Read once at
  // start (a reload that changes it needs a restart).
  struct Kubernetes {
    bool enabled = false;
    proto::HostPort api_server;     // from "http://host:port" or "https://host:port"
    bool api_server_tls = false;    // https://: TLS, the certificate verified for api_server's host
    std::string ca_file;            // CA bundle for https (in a pod: the service account's ca.crt);
    std::string ca_pem;             //   "" = the system's CAs. Its content, read at load
    std::string api_server_url;     // as written
    std::string namespace_name;     // required when enabled
    std::string label_selector;     // "" = every pod of the namespace
    // Bearer token, read at start and again every token_refresh; "" = send none (kubectl proxy).
    std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    std::chrono::milliseconds token_refresh{60000};
    std::string role_label = "pdrouter.io/role";  // its value: prefill | decode
    // The other way to give pods their role: Kubernetes label selectors (proto/k8s_label_selector.h),
    // both set or neither, and then role_label is not set. A pod matching both is no node
    // (counted, discovery/sources/kubernetes/pod_node.h). Empty text = not set.
    proto::LabelSelector prefill_selector;
    proto::LabelSelector decode_selector;
    bool role_label_set = false;  // role_label was written in the file
    bool uses_selectors() const { return !prefill_selector.text.empty(); }
    uint16_t port = 8000;  // the pods' HTTP port unless annotation pdrouter.io/port says otherwise
    std::chrono::seconds watch_timeout{300};   // a watch is re-opened (from its resourceVersion) after this
    std::chrono::milliseconds retry{1000};     // after a failed list or watch
  } kubernetes;

  // OpenTelemetry traces of P/D requests (router/tracing/), exported over OTLP/HTTP with JSON
  // encoding. Off unless `endpoint` is set. W3C traceparent/tracestate are taken from the client
  // (a sampled parent is always recorded, an unsampled one never: parent-based sampling) or
  // started here for sampling_ratio of the requests, and sent to both legs with a span id per leg.
  // Only sampling_ratio applies on reload; the rest needs a restart.
  struct Tracing {
    std::string endpoint;       // as written: "http://host:port/path" ("" = tracing off)
    proto::HostPort collector;  // parsed from endpoint
    std::string collector_path;  // "/v1/traces"
    double sampling_ratio = 1.0;  // requests without a client traceparent that are traced, 0..1
    std::string service_name = "pdrouter";  // the resource's service.name
    uint32_t max_queue_spans = 8192;  // spans waiting for export; more are dropped (counted)
    std::chrono::milliseconds batch{1000};  // a batch is sent at least this often while spans wait
    uint32_t max_batch_spans = 512;          // ... or as soon as this many wait
    std::chrono::milliseconds export_timeout{2000};  // one export (connect, send, answer)
    bool enabled() const { return !endpoint.empty(); }
  } tracing;

  std::vector<StaticInstance> static_instances;
};

// Parses and validates YAML text. `filename` only labels errors. On error the Status message reads
// "FILE:LINE:COLUMN: KEY.PATH: what is wrong" (1-based line/column of the offending node) and `out`
// is untouched. Secrets named by *_env / *_file keys are resolved here (a missing variable or
// unreadable file is an error). Unknown keys are errors (typos must not pass silently).
Status parse_topology(std::string_view yaml_text, std::string_view filename, Topology* out);
// Reads the file (size limit 1 MiB) then parse_topology.
Status load_topology_file(const std::string& path, Topology* out);

}  // namespace pdr::config
