#include "node/sim/engine/profile.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace pdr::node::sim {
namespace {

// One row per setting: a profile file and the flags go through the same table, so both accept
// exactly the same names and ranges.
struct Setting {
  const char* name;
  const char* help;
  uint32_t EngineProfile::*u32 = nullptr;
  uint64_t EngineProfile::*u64 = nullptr;
  double EngineProfile::*f64 = nullptr;
  double min = 0;
  double max = 0;
};

const Setting kSettings[] = {
    {"block-size", "Tokens per KV block.", &EngineProfile::block_size, nullptr, nullptr, 1, 4096},
    {"num-gpu-blocks-override", "KV blocks per DP rank (the first is vLLM's null block).",
     &EngineProfile::num_gpu_blocks, nullptr, nullptr, 2, 1 << 26},
    {"max-num-batched-tokens", "Token budget of one step.", &EngineProfile::max_num_batched_tokens,
     nullptr, nullptr, 1, 1 << 24},
    {"max-num-seqs", "Running seats.", &EngineProfile::max_num_seqs, nullptr, nullptr, 1, 1 << 20},
    {"max-model-len", "Longest prompt plus output accepted.", &EngineProfile::max_model_len, nullptr,
     nullptr, 2, 10000000},
    {"step-overhead-ms", "Step time: fixed part per step.", nullptr, nullptr,
     &EngineProfile::step_overhead_ms, 0, 1e6},
    {"step-weight-read-ms", "Step time: floor of the per-token part (the weights' read).", nullptr,
     nullptr, &EngineProfile::step_weight_read_ms, 0, 1e6},
    {"step-ms-per-token", "Step time: per token computed.", nullptr, nullptr,
     &EngineProfile::step_ms_per_token, 0, 1e6},
    {"step-ms-per-attention-pair", "Step time: per query-key pair of a prefill chunk.", nullptr,
     nullptr, &EngineProfile::step_ms_per_attention_pair, 0, 1e6},
    {"step-ms-per-context-token", "Step time: per context token a decode reads.", nullptr, nullptr,
     &EngineProfile::step_ms_per_context_token, 0, 1e6},
    {"kv-bytes-per-token", "Modelled KV bytes of one token (all layers).", nullptr,
     &EngineProfile::kv_bytes_per_token, nullptr, 1, 1e9},
    {"kv-transfer-latency-ms", "KV transfer: fixed time per request.", nullptr, nullptr,
     &EngineProfile::kv_transfer_latency_ms, 0, 1e6},
    {"kv-transfer-gbps", "KV transfer: most GB/s (1e9 bytes) one request gets.", nullptr, nullptr,
     &EngineProfile::kv_transfer_gbps, 1e-6, 1e6},
    {"kv-node-gbps", "KV transfer: GB/s a node's transfers share.", nullptr, nullptr,
     &EngineProfile::kv_node_gbps, 1e-6, 1e6},
};

std::string canonical(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

std::string range_text(const Setting& s) {
  return number_text(s.min) + ".." + number_text(s.max);
}

std::string default_text(const Setting& s) {
  const EngineProfile defaults;
  if (s.u32) return std::to_string(defaults.*s.u32);
  if (s.u64) return std::to_string(defaults.*s.u64);
  return number_text(defaults.*s.f64);
}

}  // namespace

std::vector<EngineSettingInfo> engine_setting_infos() {
  std::vector<EngineSettingInfo> out;
  for (const Setting& s : kSettings) out.push_back({s.name, s.help, default_text(s)});
  return out;
}

std::string set_engine_setting(EngineProfile* profile, std::string_view raw_name,
                               std::string_view raw_value) {
  const std::string name = canonical(trim(raw_name));
  const std::string_view value = trim(raw_value);
  const Setting* setting = nullptr;
  for (const Setting& s : kSettings) {
    if (name == s.name) setting = &s;
  }
  if (setting == nullptr) return "unknown engine setting '" + name + "'";
  const std::string bad = name + " '" + std::string(value) + "': expected ";
  if (setting->f64 != nullptr) {
    double v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v) ||
        v < setting->min || v > setting->max) {
      return bad + "a number in " + range_text(*setting);
    }
    profile->*setting->f64 = v;
    return "";
  }
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || static_cast<double>(v) < setting->min ||
      static_cast<double>(v) > setting->max) {
    return bad + "an integer in " + range_text(*setting);
  }
  if (setting->u32 != nullptr) {
    profile->*setting->u32 = static_cast<uint32_t>(v);
  } else {
    profile->*setting->u64 = v;
  }
  return "";
}

std::string apply_engine_profile_text(EngineProfile* profile, std::string_view text) {
  EngineProfile next = *profile;
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty() || line == "---") continue;
    const size_t sep = line.find_first_of(":=");
    if (sep == std::string_view::npos) {
      return "line " + std::to_string(line_no) + ": expected 'key: value' or 'key=value'";
    }
    if (std::string e = set_engine_setting(&next, line.substr(0, sep), line.substr(sep + 1)); !e.empty()) {
      return "line " + std::to_string(line_no) + ": " + e;
    }
  }
  *profile = next;
  return "";
}

std::string validate_engine_profile(const EngineProfile& p) {
  const uint64_t capacity = uint64_t{p.num_gpu_blocks - 1} * p.block_size;
  if (p.max_model_len > capacity) {
    // vLLM refuses to start when one sequence of max_model_len tokens cannot fit its KV cache.
    return "max-model-len " + std::to_string(p.max_model_len) + " is more than the " +
           std::to_string(capacity) + " tokens the KV cache holds (num-gpu-blocks-override - 1 = " +
           std::to_string(p.num_gpu_blocks - 1) + " blocks of block-size " +
           std::to_string(p.block_size) + ")";
  }
  return "";
}

double step_time_ms(const EngineProfile& p, const StepShape& shape) {
  return p.step_overhead_ms +
         std::max(p.step_weight_read_ms, p.step_ms_per_token * static_cast<double>(shape.tokens)) +
         p.step_ms_per_attention_pair * shape.attention_pairs +
         p.step_ms_per_context_token * static_cast<double>(shape.context_tokens);
}

}  // namespace pdr::node::sim
