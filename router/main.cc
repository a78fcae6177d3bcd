// pdrouter: the P/D router process. main() parses the command line (--help, --version), sets up
// logging and maps the outcome to an exit code; router/server.h owns the process's parts, starts
// them in order and stops them in reverse order. Threads:
//   main thread      libuv loop: SIGINT/SIGTERM (graceful stop), SIGHUP + file watch (reload)
//   discovery thread ZMQ ROUTER listener -> registry snapshots        (discovery/)
//   kv_events thread ZMQ SUB to each node's KV events -> block index    (router/cache/; optional)
//   N HTTP workers   P/D proxying (router/proxy/), /health, /status, /metrics, admin API
#include <CLI/CLI.hpp>
#include <csignal>
#include <string>
#include <utility>

#include "proto/base/log.h"
#include "router/route_table.h"
#include "router/server.h"

namespace pdr {
namespace {

// --help's footer: the endpoint list comes from the route table (router/route_table.cc).
std::string help_footer() {
  return "Endpoints (METHOD PATH LISTENER what):\n" + router::RouteTable::pdrouter().help_text() +
         R"(
The P/D endpoints split each request into a prefill and a decode leg for the pair's connector
(NIXL, MoRIIO READ/WRITE, Mooncake, P2P-NCCL, SGLang). The admin API (/admin/...) takes the key
from admin.api_key_env or admin.api_key_file, as Bearer or X-API-Key. Unknown paths answer 404,
a method a path does not accept 405 with Allow. HEAD is answered on every GET route (the GET
answer's status and headers, no body). With listeners.admin set, the routes marked admin
are served only on that listener and those marked client only on listeners.http (404 on the
other); both serve the ones marked both. Without it, listeners.http serves every route.
limits.max_concurrent_requests (429 with Retry-After) and limits.max_buffered_bytes cover the
P/D endpoints and the one-node ones (render, tokenize, detokenize, pooling, audio, pass-through)
together.

Nodes register over ZMQ (DEALER -> our ROUTER) with vLLM's MoRIIO or P2P-NCCL messages, or
pdrouter's extended format (see proto/DISCOVERY.md); `pdnode register` does it for any node.

Client keys: with client_auth.keys_file in the topology every client route but /health and
/ready needs one of its keys, as Authorization: Bearer or x-api-key (401 otherwise); each key
names a tenant, whose limits (tenants:) answer 429 with Retry-After. access_log.path writes one
JSON line per client request.

Signals: SIGTERM/SIGINT stop gracefully (in-flight requests drain for timeouts.drain_ms);
SIGHUP reloads the topology file and the client key file (both are also reloaded when they
change) and reopens the access log; SIGUSR1 reopens the access log only (logrotate). A reload
that fails validation is logged, counted, and the running configuration is kept.

On start pdrouter prints one line to stdout:
  pdrouter listening http=HOST:PORT discovery=ENDPOINT [admin=HOST:PORT]
Exit codes: 0 after a graceful stop, 1 on a start-up failure, 2 on bad flags or topology.)";
}

void setup_logging(const std::string& level) {
  pdr::log::log_to_stderr("pdrouter", pdr::log::level_from_name(level).value_or(pdr::log::Level::kInfo),
                          /*timestamps=*/true);
}

// Exit codes: 0 after a graceful stop, 1 on a start-up failure, 2 on bad flags or topology.
int exit_code(router::Server::StartResult result) {
  switch (result) {
    case router::Server::StartResult::kStarted:
      return 0;
    case router::Server::StartResult::kBadConfiguration:
      return 2;
    case router::Server::StartResult::kFailed:
      return 1;
  }
  return 1;
}

}  // namespace
}  // namespace pdr

int main(int argc, char** argv) {
  // A peer that closes while we write must be an EPIPE error on that connection, not the end
  // of the process.
  std::signal(SIGPIPE, SIG_IGN);
  pdr::router::ServerFlags cli;
  std::string log_level = "info";
  CLI::App app{"pdrouter " PDR_VERSION
               ": a router for disaggregated prefill/decode LLM serving with vLLM and SGLang.\n"
               "Nodes register over ZeroMQ; clients use the OpenAI-style HTTP API."};
  app.add_option("-c,--config", cli.config_path,
                 "YAML topology file (every key: deploy/topology.example.yaml). Reloaded on change and "
                 "on SIGHUP. Without it, built-in defaults apply.")
      ->check(CLI::ExistingFile);
  app.add_option("--http", cli.http,
                 "HTTP listen address HOST:PORT; overrides listeners.http (default 0.0.0.0:10001; "
                 "port 0 picks a free port, printed on start)");
  app.add_option("--discovery", cli.discovery,
                 "ZMQ endpoint nodes register with; overrides listeners.discovery (default "
                 "tcp://*:36367, the port vLLM's MoRIIO proxy uses; tcp://HOST:0 picks a free port)");
  app.add_option_function<uint32_t>(
         "--workers", [&cli](const uint32_t& n) { cli.workers = n; cli.workers_set = true; },
         "HTTP worker threads; overrides workers (0 = one per core)")
      ->check(CLI::Range(0u, 256u));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error (default info)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.set_version_flag("--version", "pdrouter " PDR_VERSION);
  app.footer(pdr::help_footer());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  pdr::setup_logging(log_level);
  // Declared after the parse: its parts (and their threads) exist only for a real start.
  pdr::router::Server server(std::move(cli));
  const pdr::router::Server::StartResult result = server.start();
  if (result != pdr::router::Server::StartResult::kStarted) return pdr::exit_code(result);
  server.run();
  return 0;
}
