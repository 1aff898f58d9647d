#!/usr/bin/env python3
"""Regenerates the seed corpora under tests/fuzz/corpus/ (run from the repository root).

    tests/fuzz/make_corpus.py GEN

GEN holds what loom itself wrote (see tests/fuzz/README.md): GEN/tok/{vocab.json,merges.txt}
(`loom tokenizer train`), GEN/data/tiny.{idx,bin} (`loom preprocess`), GEN/hf/tok*.json
(Hugging Face `tokenizers`), GEN/run/checkpoints/iter_0000001/ (`loom train`, 1 step).
The rest is written here. Every file stays under 50 KB.
"""
import glob
import json
import os
import struct
import sys


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def put(target, name, data):
    d = os.path.join("tests/fuzz/corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 50_000, (target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def safetensors(tensors, metadata=None, crc=False):
    """tensors: [(name, dtype, shape, bytes)] -> file bytes."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    meta = dict(metadata or {})
    if crc:
        meta["crc32c"] = json.dumps({n: "%08x" % crc32c(r) for n, _, _, r in tensors},
                                    separators=(",", ":"), sort_keys=True)
    if meta:
        header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def main(gen):
    # spec: the shipped configs (the GPU ones too: FP8, CUDA graphs, kernel pins) and the
    # reference specs.
    for path in sorted(glob.glob("configs/*.json") + glob.glob("configs/gpu/*.json") +
                       glob.glob("tests/reference/*.json")):
        put("spec", path.replace("/", "_"), read(path))
    # override: --set assignments, one a line.
    for i, text in enumerate([
        "model.num_layers=4",
        "train.seed=7\noptimizer.lr=0.01",
        "model.layers.1.b=[1,2,3]",
        'data.impl="mock"',
        "parallel.tensor=2\nparallel.pipeline=1\nlog.interval=10",
        "model.layer={\"impl\":\"x\",\"n\":{\"m\":1}}",
        "new.section.key=value",
        "model.layers.0=null",
    ]):
        put("override", "set%d.txt" % i, text)
    # indexed: uint32 LE length of the .idx, the .idx, the .bin.
    idx, bin_ = read(os.path.join(gen, "data/tiny.idx")), read(os.path.join(gen, "data/tiny.bin"))
    put("indexed", "tiny_preprocess", struct.pack("<I", len(idx)) + idx + bin_)
    # A hand-made one: 2 documents of 3 and 1 u16 tokens.
    idx2 = (b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 8, 2, 3) + struct.pack("<2i", 3, 1)
            + struct.pack("<2q", 0, 6) + struct.pack("<3q", 0, 1, 2))
    put("indexed", "two_docs_u16", struct.pack("<I", len(idx2)) + idx2 + struct.pack("<4H", 5, 6, 7, 0))
    idx3 = (b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 4, 1, 2) + struct.pack("<i", 2)
            + struct.pack("<q", 0) + struct.pack("<2q", 0, 1))
    put("indexed", "one_doc_i32", struct.pack("<I", len(idx3)) + idx3 + struct.pack("<2i", 1, 299))
    # tokenizer: the JSON file, NUL, merges.txt.
    vocab, merges = read(os.path.join(gen, "tok/vocab.json")), read(os.path.join(gen, "tok/merges.txt"))
    put("tokenizer", "gpt2_vocab_merges", vocab + b"\0" + merges)
    put("tokenizer", "gpt2_vocab_no_merges", vocab)
    for path in sorted(glob.glob(os.path.join(gen, "hf/tok*.json"))):
        put("tokenizer", "hf_" + os.path.basename(path), read(path))
    # safetensors.
    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    put("safetensors", "two_tensors", safetensors(
        [("wte.weight", "F32", [2, 2], f32(1, 2, 3, 4)), ("ln.bias", "F32", [2], f32(0.5, -1))]))
    put("safetensors", "loom_crc", safetensors(
        [("a", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40"), ("b", "I64", [1], struct.pack("<q", 9)),
         ("c", "F16", [0, 4], b"")], metadata={"format": "pt"}, crc=True))
    put("safetensors", "empty", safetensors([]))
    # checkpoint: a sharded checkpoint's sealed files (loom train, 1 step), and the body of
    # metadata.json with rank 0's index as "shard" (see checkpoint_fuzz.cc).
    ck = os.path.join(gen, "run/checkpoints/iter_0000001")
    meta, index = read(os.path.join(ck, "metadata.json")), read(os.path.join(ck, "shards/rank_00000.json"))
    put("checkpoint", "metadata.json", meta)
    put("checkpoint", "rank_00000.json", index)
    body = json.loads(meta)
    body["shard"] = json.loads(index)
    put("checkpoint", "metadata_with_shard.json", json.dumps(body, separators=(",", ":")))
    for path in sorted(glob.glob("tests/reference/*_hf_tiny.json"))[:2]:
        put("checkpoint", "spec_" + os.path.basename(path), read(path))
    put("checkpoint", "hf_config.json", json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
        "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 89, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "hidden_act": "silu", "torch_dtype": "float32"}))
    # manifest: the plugins' manifests.
    for path in sorted(glob.glob("plugins/*/manifest.json") + glob.glob("kernels/*/manifest.json")
                       + glob.glob("tests/plugins/*/manifest.json")):
        put("manifest", path.replace("/", "_"), read(path))
    # store: address NUL run id NUL key NUL value.
    for i, parts in enumerate([
        ["/tmp/rdzv", "run-1", "agree/spec/1", '{"model":{"impl":"gpt"}}'],
        ["redis://localhost:6379/0", "job", "comm/world/0", "\x01\x02\x03\x04" * 8],
        ["redis://[::1]:7000", "r", "", ""],
        ["file:/x", "run/../2", "key with spaces/and.dots", "ok"],
    ]):
        put("store", "store%d" % i, "\0".join(parts))


if __name__ == "__main__":
    main(sys.argv[1])
