#include "router/metrics_page.h"

#include <map>

namespace pdr::router {

void write_discovery_metrics(MetricsWriter& out, const discovery::DiscoveryCounters& c,
                             const discovery::RegistrySnapshot& snapshot, const TopologyMetrics& topology) {
  auto v = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  out.counter("pdrouter_discovery_frames_total", "ZMQ messages received on the discovery socket",
              v(c.frames_received));
  for (auto format : {proto::RegistrationFormat::kMoriio, proto::RegistrationFormat::kMoriioLegacy,
                      proto::RegistrationFormat::kP2pNccl, proto::RegistrationFormat::kPdrouter}) {
    out.counter("pdrouter_registrations_accepted_total", "Registration messages applied to the registry",
                v(c.accepted_by_format[static_cast<size_t>(format)]),
                {{"format", std::string(proto::to_string(format))}});
  }
  for (size_t r = 0; r < c.rejected.size(); ++r) {
    out.counter("pdrouter_registrations_rejected_total",
                "Discovery messages that changed nothing, by reason", v(c.rejected[r]),
                {{"reason", std::string(discovery::to_string(static_cast<discovery::RejectReason>(r)))}});
  }
  out.counter("pdrouter_discovery_hellos_total", "HELLO messages (ignored)", v(c.hellos));
  out.counter("pdrouter_discovery_goodbyes_total", "Goodbye messages that removed an instance", v(c.goodbyes));
  out.counter("pdrouter_instances_added_total", "Instances registered for the first time", v(c.added));
  out.counter("pdrouter_instance_expiries_total", "Instances expired after their TTL", v(c.expiries));
  out.counter("pdrouter_instance_restarts_total", "Registrations with a new epoch (node restarted)",
              v(c.restarts));
  out.counter("pdrouter_instance_revivals_total", "Expired instances that registered again", v(c.revived));
  out.counter("pdrouter_discovery_acks_sent_total", "Acknowledgements sent to pdrouter-format nodes",
              v(c.acks_sent));
  out.counter("pdrouter_discovery_peer_connections_total", "TCP connections accepted by the discovery socket",
              v(c.peer_connections));
  out.counter("pdrouter_discovery_peer_disconnects_total",
              "Discovery peers disconnected (including frames over the hard size limit)", v(c.peer_disconnects));
  out.counter("pdrouter_registry_snapshots_total", "Registry snapshots published", v(c.snapshots_published));
  out.counter("pdrouter_discovery_handshakes_admitted_total",
              "Discovery connections admitted at the handshake (discovery.allowed_peers, CURVE keys)",
              v(c.handshakes_admitted));
  for (size_t r = 0; r < c.handshakes_refused.size(); ++r) {
    out.counter("pdrouter_discovery_handshakes_refused_total",
                "Discovery connections refused at the handshake, by reason", v(c.handshakes_refused[r]),
                {{"reason", std::string(discovery::to_string(static_cast<discovery::HandshakeRefusal>(r)))}});
  }
  for (size_t k = 0; k < config::kAdmissionClasses; ++k) {
    out.gauge("pdrouter_registered_instances", "Registered (node-sent) entries by admission class",
              static_cast<double>(snapshot.count_by_class[k]),
              {{"admission", std::string(config::to_string(static_cast<config::AdmissionClass>(k)))}});
  }
  for (proto::Role role : {proto::Role::kPrefill, proto::Role::kDecode}) {
    for (auto state : {discovery::InstanceState::kUp, discovery::InstanceState::kDraining,
                       discovery::InstanceState::kExpired}) {
      out.gauge("pdrouter_instances", "Instances in the registry by role and state",
                static_cast<double>(snapshot.count(role, state)),
                {{"role", std::string(proto::to_string(role))}, {"state", std::string(discovery::to_string(state))}});
    }
  }
  out.counter("pdrouter_topology_reloads_total", "Topology reloads by result",
              static_cast<double>(topology.reloads_ok), {{"result", "ok"}});
  out.counter("pdrouter_topology_reloads_total", "Topology reloads by result",
              static_cast<double>(topology.reloads_failed), {{"result", "failed"}});
}

void write_http_metrics(MetricsWriter& out, const http::ServerStats& s) {
  auto v = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  out.counter("pdrouter_http_connections_total", "HTTP connections accepted", v(s.connections_accepted));
  out.counter("pdrouter_http_connections_rejected_total", "HTTP connections refused at once (max_connections)",
              v(s.connections_rejected));
  out.counter("pdrouter_http_busy_refusals_total",
              "HTTP connections answered 503 and closed at accept (max_connections, or no descriptor left)",
              v(s.busy_refusals));
  out.gauge("pdrouter_http_connections_active", "Open HTTP connections", v(s.connections_active));
  out.counter("pdrouter_http_requests_total", "HTTP requests dispatched to handlers", v(s.requests));
  for (size_t c = 1; c < s.responses_by_class.size(); ++c) {
    out.counter("pdrouter_http_responses_total", "HTTP responses by status class", v(s.responses_by_class[c]),
                {{"class", std::to_string(c) + "xx"}});
  }
  const std::pair<const char*, const std::atomic<uint64_t>*> rejections[] = {
      {"bad_request", &s.bad_requests},       {"header_too_large", &s.header_too_large},
      {"body_too_large", &s.body_too_large},  {"header_timeout", &s.header_timeouts},
      {"body_timeout", &s.body_timeouts}};
  for (const auto& [reason, counter] : rejections) {
    out.counter("pdrouter_http_rejected_total", "Requests the server refused before any handler ran",
                v(*counter), {{"reason", reason}});
  }
  out.counter("pdrouter_http_idle_timeouts_total", "Keep-alive connections closed after idling", v(s.idle_timeouts));
  out.counter("pdrouter_http_client_aborts_total", "Clients gone before their response completed",
              v(s.client_aborts));
  out.counter("pdrouter_http_handler_errors_total", "Handlers that threw or dropped their response",
              v(s.handler_errors));
  out.counter("pdrouter_http_output_pauses_total",
              "Times a connection stopped reading requests while 256 KiB of answers waited for its client",
              v(s.output_pauses));
  out.gauge("pdrouter_http_output_buffered_bytes", "Answer bytes queued for clients", v(s.output_buffered_bytes));
  out.counter("pdrouter_http_write_stalls_total", "Connections closed because their queued answers made no progress",
              v(s.write_stalls));
  out.counter("pdrouter_http_output_writes_total",
              "Writes of answer bytes to client sockets (everything a connection queued in one loop turn leaves in one write)",
              v(s.output_writes));
  out.counter("pdrouter_http_accept_errors_total",
              "Failed accepts (out of descriptors: answered 503 from the reserve; else accepting pauses 100 ms)",
              v(s.accept_errors));
}

}  // namespace pdr::router
