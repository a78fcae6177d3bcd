// `pdnode xfer-bench`: throughput and latency of the transfer engine between two processes, with
// the ceilings measured in the same run (docs/design/kv-transfer.md, Targets): raw single-stream loopback TCP (a plain
// blocking socket pair, same message sizes) and memcpy.
//
// One command runs both sides: it starts a copy of itself with --serve (the target: an engine with
// every requested backend, a pool filled with a known pattern, and the raw TCP sink), reads the
// target's descriptor from that child's stdout, then measures for each backend (and, for tcp, each
// lane count), each op (READ, WRITE) and each block size: blocks are laid out with a one-block gap
// so none coalesce, submitted in batches of about 8 MiB, two batches in flight. Then the 64 KiB
// latency of one transfer against one raw 64 KiB message round trip. Prints tables (and --json);
// exits 1 if any transfer failed or a READ brought back the wrong bytes, 2 on bad flags.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace pdr::node {

struct XferBenchFlags {
  std::string backends = "tcp,shm";
  std::string lanes = "1,2,4";             // tcp only
  std::string sizes = "16K,64K,256K,1M,4M,16M";
  std::string ops = "read,write";
  std::string bytes_per_point = "512M";    // bytes moved per (backend, lanes, op, size) point
  std::uint32_t latency_iterations = 2000;
  std::string pool = "64M";                // pool bytes on each side
  std::string json;                        // also write results as JSON here
  bool smoke = false;                      // CI: tiny volumes, checks only that everything works
  bool serve = false;                      // internal: the target side
};

CLI::App* add_xfer_bench_command(CLI::App& app, XferBenchFlags* flags);
int run_xfer_bench_command(const XferBenchFlags& flags);

}  // namespace pdr::node
