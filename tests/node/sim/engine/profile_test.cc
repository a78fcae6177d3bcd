// Engine settings (node/sim/engine/profile.h): the profile file, the flag values and their
// ranges go through one table.
#include "node/sim/engine/profile.h"

#include <gtest/gtest.h>

namespace pdr::node::sim {
namespace {

TEST(EngineProfile, DefaultsAreTheDocumentedH100Profile) {
  const EngineProfile p;
  EXPECT_EQ(p.block_size, 16u);
  EXPECT_EQ(p.num_gpu_blocks, 29000u);
  EXPECT_EQ(p.max_num_batched_tokens, 8192u);
  EXPECT_EQ(p.max_num_seqs, 1024u);
  EXPECT_EQ(p.max_model_len, 131072u);
  EXPECT_EQ(p.kv_bytes_per_token, 131072u);
  EXPECT_EQ(validate_engine_profile(p), "");
}

TEST(EngineProfile, ProfileTextAcceptsYamlAndKeyValueLines) {
  EngineProfile p;
  const std::string text =
      "# an A100 40 GB, roughly\n"
      "---\n"
      "max-num-seqs: 256          # vLLM's default below 70 GiB\n"
      "max_num_batched_tokens=2048\n"
      "  num-gpu-blocks-override :  5000\n"
      "step-ms-per-token: 0.03\n"
      "\n";
  EXPECT_EQ(apply_engine_profile_text(&p, text), "");
  EXPECT_EQ(p.max_num_seqs, 256u);
  EXPECT_EQ(p.max_num_batched_tokens, 2048u);
  EXPECT_EQ(p.num_gpu_blocks, 5000u);
  EXPECT_DOUBLE_EQ(p.step_ms_per_token, 0.03);
  EXPECT_EQ(p.block_size, 16u);  // untouched
}

TEST(EngineProfile, BadLinesAreRefusedWithTheirNumberAndNothingChanges) {
  EngineProfile p;
  EXPECT_EQ(apply_engine_profile_text(&p, "max-num-seqs: 8\nwarp-drive: 9\n"),
            "line 2: unknown engine setting 'warp-drive'");
  EXPECT_EQ(p.max_num_seqs, 1024u);
  EXPECT_EQ(apply_engine_profile_text(&p, "max-num-seqs 8\n"),
            "line 1: expected 'key: value' or 'key=value'");
  EXPECT_EQ(apply_engine_profile_text(&p, "max-num-seqs: 0\n"),
            "line 1: max-num-seqs '0': expected an integer in 1..1048576");
  EXPECT_EQ(apply_engine_profile_text(&p, "step-overhead-ms: fast\n"),
            "line 1: step-overhead-ms 'fast': expected a number in 0..1000000");
  EXPECT_EQ(apply_engine_profile_text(&p, "block-size: 16.5\n"),
            "line 1: block-size '16.5': expected an integer in 1..4096");
}

TEST(EngineProfile, SettingNamesMatchTheFlags) {
  std::vector<std::string> names;
  for (const EngineSettingInfo& s : engine_setting_infos()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "block-size", "num-gpu-blocks-override", "max-num-batched-tokens",
                       "max-num-seqs", "max-model-len", "step-overhead-ms", "step-weight-read-ms",
                       "step-ms-per-token", "step-ms-per-attention-pair",
                       "step-ms-per-context-token", "kv-bytes-per-token", "kv-transfer-latency-ms",
                       "kv-transfer-gbps", "kv-node-gbps"}));
  EXPECT_EQ(engine_setting_infos()[1].default_value, "29000");
  EXPECT_EQ(engine_setting_infos()[8].default_value, "1e-06");
}

TEST(EngineProfile, MaxModelLenMustFitTheKvCache) {
  EngineProfile p;
  p.num_gpu_blocks = 101;
  p.max_model_len = 1600;
  EXPECT_EQ(validate_engine_profile(p), "");
  p.max_model_len = 1601;
  EXPECT_NE(validate_engine_profile(p).find("more than the 1600 tokens"), std::string::npos);
}

}  // namespace
}  // namespace pdr::node::sim
