#!/usr/bin/python3
"""Writes the seed corpus for kv_events_fuzz: vLLM KV event batches (shared/API_FACTS.md 2.2).

Run with Debian's interpreter (python3-msgpack): /usr/bin/python3 tests/fuzz/make_kv_events_corpus.py
Array encoding (vLLM <= 0.23: events are positional arrays, tag first) and map encoding (vLLM >=
0.26: events are maps tagged by "type"); 2- and 3-element batch envelopes; hashes as u64 and as
raw sha256 bytes.
"""
import hashlib
import os

import msgpack

TOKENS = list(range(100, 132))
H1, H2 = 0xFFFFFFFFFFFFFFF0, 12345
RAW = hashlib.sha256(b"block").digest()

VECTORS = {
    "array_two_slot": [1764115200.5, [["BlockStored", [H1, H2], None, TOKENS, 16, None, "GPU"]]],
    "array_dp_rank": [1764115200.5, [
        ["BlockStored", [H1], H2, TOKENS[:16], 16, None, "GPU", None, None, 0, "full", None],
        ["BlockRemoved", [H2], "GPU", 0],
        ["AllBlocksCleared"]], 1],
    "map_events": [1764115200.5, [
        {"type": "BlockStored", "block_hashes": [H1, H2], "parent_block_hash": None,
         "token_ids": TOKENS, "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": None, "extra_keys": [None, [["img-1", 0]]]},
        {"type": "BlockRemoved", "block_hashes": [H1], "medium": "GPU"},
        {"type": "AllBlocksCleared"}], 0],
    "raw_hashes": [1764115200.5, [["BlockStored", [RAW], RAW, TOKENS[:16], 16, None, "GPU"]], None],
    "unknown_event": [1764115200.5, [["SomethingNew", 1, 2], {"type": "Other", "x": 1}], None],
    # Every positional field vLLM added (lora_name, extra_keys with the adapter's key first,
    # group_idx, the group's spec): a full-attention and a sliding-window group of one hybrid model.
    "array_hybrid_lora": [1764115200.5, [
        ["BlockStored", [H1, H2], None, TOKENS, 16, 3, "GPU", "adapter-a",
         [["adapter-a"], ["adapter-a", ["mm-1", 4]]], 0, "full_attention", None],
        ["BlockStored", [H1, H2], None, TOKENS, 16, 3, "GPU", "adapter-a",
         [["adapter-a"], ["adapter-a", ["mm-1", 4]]], 1, "sliding_window", 1024],
        ["BlockRemoved", [H1], "GPU", 1]], 0],
    # vLLM >= 0.26 maps with the newer offloading fields, a salted first block and a CPU tier's
    # tokenless placeholder store.
    "map_tiers_salt": [1764115200.5, [
        {"type": "BlockStored", "block_hashes": [H1], "parent_block_hash": None, "token_ids": TOKENS[:16],
         "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [["salt-1"]],
         "group_idx": 0, "kv_cache_spec_kind": "full_attention"},
        {"type": "BlockStored", "block_hashes": [H1], "parent_block_hash": None, "token_ids": [],
         "block_size": 0, "lora_id": None, "medium": "CPU", "lora_name": None, "group_idx": 0,
         "locality": "LOCAL", "ownership": "cpu-tier"},
        {"type": "BlockRemoved", "block_hashes": [H1], "medium": "CPU", "group_idx": 0, "locality": "LOCAL"},
        {"type": "BlockStored", "block_hashes": [H2], "parent_block_hash": H1, "token_ids": TOKENS[16:],
         "block_size": 16, "lora_id": None, "medium": "STORAGE", "lora_name": None, "session_id": "s"}], 1],
    "empty_two_slot": [1764115200.5, []],
    "empty_dp_rank": [1764115200.5, [], 0],
    "map_batch": {"ts": 1764115200.5, "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 2},
    "map_batch_empty": {"ts": 1764115200.5, "events": []},
}

# Raw bytes msgpack.packb cannot produce: container headers declaring more elements than the
# payload holds (msgpack-cxx allocates their slots at the header; proto/msgpack_prescan.h refuses
# them first). Eight nested array32 headers of 1,048,576 items, then five bytes: 45 bytes.
RAW_VECTORS = {
    "nested_array32_headers": bytes.fromhex("dd00100000") * 8 + bytes.fromhex("0101010101"),
    "map32_header_short": bytes.fromhex("92cb41da4b0f0e000000df00000040") + b"\xa4type",
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "kv_events")
    os.makedirs(out, exist_ok=True)
    for name, batch in VECTORS.items():
        with open(os.path.join(out, name + ".msgpack"), "wb") as f:
            f.write(msgpack.packb(batch, use_bin_type=True))
    for name, raw in RAW_VECTORS.items():
        with open(os.path.join(out, name + ".msgpack"), "wb") as f:
            f.write(raw)


if __name__ == "__main__":
    main()
