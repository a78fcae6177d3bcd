// The RDMA device of one backend (contract: device.h).
#include "transfer/rdma/device.h"

#include <net/if.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "transfer/rdma/gid_rank.h"

namespace pdr::transfer::rdma {

namespace {

// "down" in /sys/class/net/<dev>/operstate; anything else ("up", "unknown" for rxe/loopback-like
// devices, or an unreadable file) counts as up so a missing sysfs never hides every GID.
bool netdev_is_up(const std::string& netdev) {
  std::ifstream in("/sys/class/net/" + netdev + "/operstate");
  std::string state;
  return !(in >> state) || state != "down";
}

Status unavailable(const std::string& why) {
  return Status(StatusCode::kIoError, "rdma unavailable: " + why);
}

}  // namespace

Status Device::open(const RdmaBackendOptions& options, VerbsLoader load_verbs) {
  if (load_verbs == nullptr) {
    return Status(StatusCode::kInvalidValue, "rdma backend built without a verbs loader");
  }
  if (Status s = load_verbs(&api_); !s) return s;
  int count = 0;
  ibv_device** list = api_->get_device_list(&count);
  if (list == nullptr || count <= 0) {
    if (list != nullptr) api_->free_device_list(list);
    return unavailable("no RDMA device found");
  }
  ibv_device* chosen = nullptr;
  for (int i = 0; i < count; ++i) {
    if (options.device.empty() || options.device == api_->get_device_name(list[i])) {
      chosen = list[i];
      break;
    }
  }
  if (chosen == nullptr) {
    api_->free_device_list(list);
    return unavailable("no device named " + options.device);
  }
  const std::string name = api_->get_device_name(chosen);
  context_ = api_->open_device(chosen);
  api_->free_device_list(list);
  if (context_ == nullptr) return unavailable("cannot open " + name);
  // From here on a failure closes what is open, so the caller never has to.
  Status status = [&]() -> Status {
    ibv_device_attr device_attr{};
    ibv_port_attr port_attr{};
    if (api_->query_device(context_, &device_attr) != 0 ||
        api_->query_port(context_, path_.port_num, &port_attr) != 0) {
      return unavailable("cannot query " + name);
    }
    if (port_attr.state != IBV_PORT_ACTIVE) {
      return unavailable("port 1 of " + name + " is not active");
    }
    max_mr_size_ = device_attr.max_mr_size;
    path_.active_mtu = port_attr.active_mtu;
    path_.max_rd_atomic =
        static_cast<std::uint8_t>(std::clamp(device_attr.max_qp_rd_atom, 1, 255));
    path_.roce = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    lid_ = port_attr.lid;
    if (Status s = choose_gid(options, port_attr.gid_tbl_len, name.c_str()); !s) return s;
    pd_ = api_->alloc_pd(context_);
    if (pd_ == nullptr) return unavailable("ibv_alloc_pd failed");
    cq_ = api_->create_cq(context_, static_cast<int>(options.cq_depth), nullptr, nullptr, 0);
    if (cq_ == nullptr) return unavailable("ibv_create_cq failed");
    return Status::ok();
  }();
  if (!status) close();
  return status;
}

// rank the table unless an index is configured. query_gid_ex (when the library has it) also
// gives the GID type and netdev the ranking prefers; plain query_gid leaves them unknown.
Status Device::choose_gid(const RdmaBackendOptions& options, int gid_table_length,
                          const char* name) {
  std::vector<GidCandidate> candidates;
  for (int i = 0; i < gid_table_length && i < 256; ++i) {
    GidCandidate c;
    c.index = i;
    if (api_->query_gid_ex != nullptr) {
      ibv_gid_entry entry{};
      if (api_->query_gid_ex(context_, path_.port_num, static_cast<std::uint32_t>(i), &entry) !=
          0) {
        continue;
      }
      std::copy(entry.gid.raw, entry.gid.raw + 16, c.gid.begin());
      c.type = entry.gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::kRoceV2
               : entry.gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::kRoceV1
                                                        : GidType::kIb;
      char ifname[IF_NAMESIZE] = {};
      if (entry.ndev_ifindex != 0 && ::if_indextoname(entry.ndev_ifindex, ifname) != nullptr) {
        c.netdev = ifname;
        c.netdev_up = netdev_is_up(c.netdev);
      }
    } else {
      ibv_gid gid{};
      if (api_->query_gid(context_, path_.port_num, i, &gid) != 0) continue;
      std::copy(gid.raw, gid.raw + 16, c.gid.begin());
    }
    candidates.push_back(std::move(c));
  }
  GidOverride choice;
  if (options.gid_index >= 0) choice.index = options.gid_index;
  const auto index = rdma::choose_gid(candidates, choice);
  if (index) {
    path_.sgid_index = static_cast<std::uint8_t>(*index);
    for (const auto& c : candidates) {
      if (c.index != *index) continue;
      gid_ = c.gid;
      gid_type_ = c.type == GidType::kRoceV2 ? 2 : c.type == GidType::kRoceV1 ? 1 : 0;
    }
  } else if (path_.roce) {
    // IB can address by LID alone; RoCE needs an L3 GID.
    return unavailable(std::string("no usable RoCE GID on ") + name);
  }
  return Status::ok();
}

void Device::close() {
  if (cq_ != nullptr) api_->destroy_cq(cq_);
  if (pd_ != nullptr) api_->dealloc_pd(pd_);
  if (context_ != nullptr) api_->close_device(context_);
  cq_ = nullptr;
  pd_ = nullptr;
  context_ = nullptr;
}

}  // namespace pdr::transfer::rdma
