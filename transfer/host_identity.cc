#include "transfer/host_identity.h"

#include <unistd.h>

#include <climits>
#include <fstream>

namespace pdr::transfer {

std::string local_hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

std::string local_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(in, id)) return {};
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

}  // namespace pdr::transfer
