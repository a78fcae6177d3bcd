#include "node/keygen_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "proto/curve_keys.h"

namespace pdr::node {
namespace {

constexpr int kExitFailure = 1;

// Creates `path` with `mode` (refusing to replace an existing file unless `force`) and writes
// `text`. The mode is set at creation so a secret is never readable by others, even briefly.
bool write_new_file(const std::string& path, const std::string& text, mode_t mode, bool force) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL);
  const int fd = ::open(path.c_str(), flags, mode);
  if (fd < 0) {
    std::fprintf(stderr, "pdnode keygen: cannot create %s: %s%s\n", path.c_str(), std::strerror(errno),
                 errno == EEXIST ? " (use --force to replace it)" : "");
    return false;
  }
  if (force && ::fchmod(fd, mode) != 0) {
    std::fprintf(stderr, "pdnode keygen: cannot set the mode of %s: %s\n", path.c_str(), std::strerror(errno));
    ::close(fd);
    return false;
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "pdnode keygen: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
      ::close(fd);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return ::close(fd) == 0;
}

}  // namespace

CLI::App* add_keygen_command(CLI::App& app, KeygenFlags* f) {
  CLI::App* cmd = app.add_subcommand(
      "keygen",
      "Make a CURVE key pair for pdrouter's discovery socket: PREFIX.key (secret, mode 0600) and\n"
      "PREFIX.pub (public). Router: discovery.curve.secret_key_file: PREFIX.key. Node sidecar:\n"
      "pdnode register --curve-server-key <router>.pub --curve-key <node>.key, with <node>.pub listed\n"
      "in the router's discovery.curve.allowed_client_keys_file.");
  cmd->add_option("prefix", f->prefix, "Path prefix of the two files, e.g. /etc/pdrouter/router")
      ->required()
      ->type_name("PREFIX");
  cmd->add_flag("--force", f->force, "Replace existing files.");
  return cmd;
}

int run_keygen_command(const KeygenFlags& flags) {
  proto::CurveKeyPair keys;
  if (Status s = proto::generate_curve_key_pair(&keys); !s.is_ok()) {
    std::fprintf(stderr, "pdnode keygen: %s\n", s.message().c_str());
    return kExitFailure;
  }
  if (!write_new_file(flags.prefix + ".key", proto::curve_certificate(keys, true), 0600, flags.force) ||
      !write_new_file(flags.prefix + ".pub", proto::curve_certificate(keys, false), 0644, flags.force)) {
    return kExitFailure;
  }
  std::printf("%s.key (secret) and %s.pub (public key %s)\n", flags.prefix.c_str(), flags.prefix.c_str(),
              keys.public_z85.c_str());
  return 0;
}

}  // namespace pdr::node
