// pdnode: node-side tools for pdrouter. Each subcommand lives in its own file (register_command.cc;
// keygen_command.cc, sim_command.cc, xfer_bench_command.cc); main() only parses and dispatches.
#include <csignal>
#include <CLI/CLI.hpp>

#include "node/keygen_command.h"
#include "node/register_command.h"
#include "node/sim_command.h"
#include "node/stop_signals.h"
#include "node/xfer_bench_command.h"

namespace {

constexpr int kExitBadFlags = 2;

// --help and --version exit 0 with their text; every other parse error exits 2 (usage error).
int exit_code_for(const CLI::App& app, const CLI::ParseError& error) {
  const int code = app.exit(error);
  return code == 0 ? 0 : kExitBadFlags;
}

}  // namespace

int main(int argc, char** argv) {
  // A router that closes a leg mid-answer (that is how it aborts) must not kill the node.
  std::signal(SIGPIPE, SIG_IGN);
  // Before any thread exists, so all threads inherit the mask and only sigwait() sees the signals.
  pdr::node::block_stop_signals();

  CLI::App app{"pdnode: node-side companion of pdrouter (vLLM prefill/decode router).", "pdnode"};
  app.set_version_flag("--version", "pdnode " PDR_VERSION);
  app.require_subcommand(1);

  pdr::node::RegisterFlags register_flags;
  CLI::App* register_command = pdr::node::add_register_command(app, &register_flags);
  pdr::node::SimFlags sim_flags;
  CLI::App* sim_command = pdr::node::add_sim_command(app, &sim_flags);
  pdr::node::KeygenFlags keygen_flags;
  CLI::App* keygen_command = pdr::node::add_keygen_command(app, &keygen_flags);
  pdr::node::XferBenchFlags xfer_bench_flags;
  CLI::App* xfer_bench_command = pdr::node::add_xfer_bench_command(app, &xfer_bench_flags);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return exit_code_for(app, e);
  }
  if (register_command->parsed()) return pdr::node::run_register_command(register_flags);
  if (sim_command->parsed()) return pdr::node::run_sim_command(sim_flags);
  if (keygen_command->parsed()) return pdr::node::run_keygen_command(keygen_flags);
  if (xfer_bench_command->parsed()) return pdr::node::run_xfer_bench_command(xfer_bench_flags);
  return kExitBadFlags;
}
