// Which unknown paths may be relayed (contract in pass_through.h).
#include "router/proxy/pass_through.h"

namespace pdr::router::proxy {
namespace {

// A deny list is never complete (a node version may add an endpoint); routing.pass_through_paths
// is the way to be sure. These are the operator endpoints of the engines pdrouter fronts.
constexpr std::string_view kDenied[] = {
    // vLLM: profiling, caches, sleep mode, collective RPC, server info (dev mode), LoRA, elastic
    // EP, pause/resume and the RL weight-update endpoints, fault tolerance.
    "/start_profile", "/stop_profile", "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache",
    "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/server_info", "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/pause/**", "/resume",
    "/is_paused", "/abort_requests", "/init_weight_transfer_engine", "/start_weight_update",
    "/start_draft_weight_update", "/update_weights", "/finish_weight_update", "/update_weight_version",
    "/weight_info", "/weight_checker", "/get_world_size", "/fault_tolerance/**",
    // SGLang: cache flush, weight updates, memory release, logging and internal state, LoRA,
    // generation pause, expert distribution recording, GC, server info.
    "/flush_cache", "/update_weights_from_disk", "/update_weights_from_tensor",
    "/update_weights_from_distributed", "/init_weights_update_group", "/release_memory_occupation",
    "/resume_memory_occupation", "/configure_logging", "/abort_request", "/set_internal_state",
    "/get_internal_state", "/get_server_info", "/load_lora_adapter", "/unload_lora_adapter", "/slow_down",
    "/pause_generation", "/continue_generation", "/start_expert_distribution_record",
    "/stop_expert_distribution_record", "/dump_expert_distribution_record", "/freeze_gc", "/shutdown",
};

}  // namespace

const std::span<const std::string_view> kNodeAdminPaths{kDenied};

bool pass_through_entry_matches(std::string_view entry, std::string_view path) {
  if (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  if (entry.ends_with("/**")) {
    const std::string_view base = entry.substr(0, entry.size() - 3);
    return path == base || (path.starts_with(base) && path.size() > base.size() && path[base.size()] == '/');
  }
  return path == entry;
}

PassThroughVerdict check_pass_through(std::string_view path, const std::vector<std::string>& allow) {
  for (const std::string_view denied : kNodeAdminPaths) {
    if (pass_through_entry_matches(denied, path)) return PassThroughVerdict::kNodeAdmin;
  }
  if (allow.empty()) return PassThroughVerdict::kAllowed;
  for (const std::string& entry : allow) {
    if (pass_through_entry_matches(entry, path)) return PassThroughVerdict::kAllowed;
  }
  return PassThroughVerdict::kNotListed;
}

}  // namespace pdr::router::proxy
