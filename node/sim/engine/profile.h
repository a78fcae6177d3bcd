// EngineProfile: the numbers behind `pdnode sim --engine vllm` (a simulated vLLM V1 engine per DP
// rank, node/sim/engine/scheduler.h): the scheduler's limits under vLLM's own flag names,
// the step-time formula's coefficients and the KV transfer model's. Pure; no I/O.
//
// Defaults: Llama-3.1-8B in BF16 on one H100 80 GB under vLLM's `vllm serve` defaults for that
// GPU (vllm/engine/arg_utils.py, get_batch_defaults: 8192 batched tokens, 1024 sequences; block
// size 16), 29,000 KV blocks (0.9 x 79.6 GiB less 15 GiB of weights, at 128 KiB per token, the
// count inference-sim's Llama-3.1-8B/H100 profile measured), max_model_len 131,072.
//
// Step time, in modelled milliseconds, of one engine step (one forward pass):
//   step_ms = step-overhead-ms                                     CPU work and kernel launches
//           + max(step-weight-read-ms, step-ms-per-token x N)      weights read once per step, or
//                                                                  the batch's linear layers once
//                                                                  they take longer
//           + step-ms-per-attention-pair x sum over prefill chunks of q x (p + q/2)
//           + step-ms-per-context-token x sum over decodes of ctx
// N is the number of tokens the step computes. A request computing q > 1 tokens is a prefill
// chunk with p tokens already computed (its q queries see p + q/2 keys on average: causal
// attention); a request computing one token is a decode whose context ctx (the tokens computed
// before the step, plus this one) is read from the KV cache. Defaults: 1.5, 6.0, 0.018, 1.0e-6,
// 4.5e-5, which give 7.5 ms for one short decode, about 10 ms for 32 decodes of 2k context, about
// 19 ms for 128 of them, about 183 ms for an 8k-token prompt in one step and about 1.1 s for a 32k
// one in 8k chunks, within 1.5x of published 8B/H100 measurements (Vidur's and inference-sim's
// profiles, ai-dynamo's mocker polynomial, vLLM's perf CI).
//
// KV transfer of a P/D decode's prompt (the decode pulls it once it has blocks for it):
//   kv-transfer-latency-ms + bytes / kv-transfer-gbps, bytes = kv-bytes-per-token x tokens pulled,
// the transfers running at once on one node sharing kv-node-gbps between them (each at most
// kv-transfer-gbps): node/sim/engine/kv_transfer_model.h. Defaults 1 ms, 25 GB/s per request, 50
// GB/s per node (one 400 Gb/s NIC), 128 KiB per token (2 x 32 layers x 8 KV heads x 128 x 2 bytes).
//
// --time-scale multiplies every modelled duration (steps, KV transfers) into wall-clock time:
// 0.1 replays an hour of traffic in six minutes. It is a run setting, not part of a profile.
//
// Settings are named like the flags (`max-num-seqs`, ...); a profile file sets any of them, one
// per line, as a flat YAML mapping (`max-num-seqs: 256`) or `key=value` (`max_num_seqs=256`: `_`
// and `-` are the same), `#` starting a comment; flags given on the command line win over the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pdr::node::sim {

struct EngineProfile {
  // Scheduler (vLLM's flags).
  uint32_t block_size = 16;               // --block-size
  uint32_t num_gpu_blocks = 29000;        // --num-gpu-blocks-override (block 0 is vLLM's null block)
  uint32_t max_num_batched_tokens = 8192; // --max-num-batched-tokens: token budget per step
  uint32_t max_num_seqs = 1024;           // --max-num-seqs: running seats
  uint32_t max_model_len = 131072;        // --max-model-len
  // Step time (modelled ms).
  double step_overhead_ms = 1.5;
  double step_weight_read_ms = 6.0;
  double step_ms_per_token = 0.018;
  double step_ms_per_attention_pair = 1.0e-6;
  double step_ms_per_context_token = 4.5e-5;
  // KV transfer.
  uint64_t kv_bytes_per_token = 131072;
  double kv_transfer_latency_ms = 1.0;
  double kv_transfer_gbps = 25.0;  // per request, 1e9 bytes/s
  double kv_node_gbps = 50.0;      // per node, shared
};

// One setting: its name (the flag without "--"), what it means, and its default as text.
struct EngineSettingInfo {
  std::string name;
  std::string help;
  std::string default_value;
};
std::vector<EngineSettingInfo> engine_setting_infos();

// Sets one setting by name (`-` or `_` between words) from its text. Returns "" or an error
// naming the setting and its valid range; `profile` is unchanged on error.
std::string set_engine_setting(EngineProfile* profile, std::string_view name, std::string_view value);

// Applies a profile file's text (format above). Returns "" or "line N: <error>".
std::string apply_engine_profile_text(EngineProfile* profile, std::string_view text);

// Cross-setting checks (a prompt of max_model_len tokens must fit the pool, as vLLM refuses to
// start otherwise). Returns "" or the error.
std::string validate_engine_profile(const EngineProfile& profile);

// What one step computes, for the formula above.
struct StepShape {
  uint64_t tokens = 0;            // N
  double attention_pairs = 0;     // sum over prefill chunks of q x (p + q/2)
  uint64_t context_tokens = 0;    // sum over decodes of ctx
};
double step_time_ms(const EngineProfile& profile, const StepShape& shape);

}  // namespace pdr::node::sim
