"""Megatron's GPT dataset indices rebuilt with numpy, compared with loom's.

Reads the indexed dataset with numpy from the format description (MMIDIDX), rebuilds the
document, sample and shuffle indices as Megatron-Core's GPTDataset does (numpy RandomState
shuffles, the separate-final-epoch rule, build_sample_idx with the extra token, drop last
partial), and requires loom's cached .npy files and sample windows to be equal.

Interpreter: Debian's /usr/bin/python3 (numpy from python3-numpy).
usage: check_gpt_indices.py OUT_DIR
"""
import json
import struct
import sys

import numpy as np

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}


def read_idx(prefix):
    buf = open(prefix + ".idx", "rb").read()
    assert buf[:9] == b"MMIDIDX\x00\x00", "bad magic"
    version, = struct.unpack_from("<Q", buf, 9)
    assert version == 1
    code = buf[17]
    seqs, docs = struct.unpack_from("<QQ", buf, 18)
    off = 34
    lengths = np.frombuffer(buf, np.int32, seqs, off)
    off += lengths.nbytes
    pointers = np.frombuffer(buf, np.int64, seqs, off)
    off += pointers.nbytes
    doc_idx = np.frombuffer(buf, np.int64, docs, off)
    tokens = np.fromfile(prefix + ".bin", DTYPES[code])
    return lengths, pointers, doc_idx, tokens, np.dtype(DTYPES[code]).itemsize


def document_index(documents, epochs, rng, separate_final):
    if not separate_final or epochs == 1:
        idx = np.mgrid[0:epochs, 0:len(documents)][1]
        idx[:] = documents
        idx = idx.reshape(-1).astype(np.int32)
        rng.shuffle(idx)
        return idx
    first = document_index(documents, epochs - 1, rng, False)
    last = document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def sample_index(sizes, doc_idx, seq, epochs, tokens_per_epoch):
    n = (epochs * tokens_per_epoch - 1) // seq
    out = np.zeros((n + 1, 2), np.int64)
    pos, offset = 0, 0
    for s in range(1, n + 1):
        remaining = seq + 1
        while remaining != 0:
            length = sizes[doc_idx[pos]] - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                if pos == len(doc_idx) - 1:
                    offset = sizes[doc_idx[pos]] - 1
                    break
                pos += 1
                offset = 0
        out[s] = (pos, offset)
    return out


def shuffle_index(first, total, rng):
    a = np.arange(0, first, dtype=np.uint32)
    rng.shuffle(a)
    if first == total:
        return a
    b = np.arange(first, total, dtype=np.uint32)
    rng.shuffle(b)
    return np.concatenate((a, b))


def main(out):
    lengths, pointers, _, tokens, width = read_idx(out + "/docs")
    cases = json.load(open(out + "/manifest.json"))
    for c in cases:
        docs = np.arange(c["begin"], c["end"], dtype=np.int32)
        seq, n = c["seq_length"], c["num_samples"]
        per_epoch = int(np.sum(lengths[docs]))
        epochs = 1
        while epochs * per_epoch < n * seq + 1:
            epochs += 1
        separate = False
        if epochs > 1:
            sans_final = ((epochs - 1) * per_epoch - 1) // seq
            separate = (n - sans_final) < int(0.80 * ((per_epoch - 1) // seq))
        rng = np.random.RandomState(c["seed"])
        doc_idx = document_index(docs, epochs, rng, separate)
        smp_idx = sample_index(lengths, doc_idx, seq, epochs, per_epoch)
        total = smp_idx.shape[0] - 1
        shf_idx = shuffle_index(sans_final if separate else total, total, rng)
        stem = c["stem"]
        loom_doc = np.load(stem + "-document_index.npy")
        loom_smp = np.load(stem + "-sample_index.npy")
        loom_shf = np.load(stem + "-shuffle_index.npy")
        assert epochs == c["epochs"], (epochs, c["epochs"])
        assert loom_doc.dtype == np.int32 and np.array_equal(loom_doc, doc_idx), "document_index"
        assert np.array_equal(loom_smp, smp_idx), "sample_index"
        assert loom_shf.dtype == np.uint32 and np.array_equal(loom_shf, shf_idx), "shuffle_index"
        # Sample windows, read as Megatron's GPTDataset reads them.
        windows = np.load(c["samples"])
        for j in range(windows.shape[0]):
            i = shf_idx[j]
            (b, bo), (e, eo) = smp_idx[i], smp_idx[i + 1]
            parts = []
            for p in range(b, e + 1):
                d = doc_idx[p]
                start = pointers[d] // width
                lo = bo if p == b else 0
                hi = eo + 1 if p == e else lengths[d]
                parts.append(tokens[start + lo:start + hi])
            expect = np.concatenate(parts).astype(np.int64)
            assert np.array_equal(windows[j], expect), f"sample {j} of {stem}"
        print(f"ok: {stem.split('/')[-1]}: {epochs} epoch(s), separate final epoch {separate}, "
              f"{total} samples")


if __name__ == "__main__":
    main(sys.argv[1])
