"""Megatron's GPT dataset indices rebuilt with numpy, compared with loom's.

Reads the indexed dataset with numpy from the format description (MMIDIDX), rebuilds the
document, sample and shuffle indices as Megatron-Core's GPTDataset does, and requires loom's
cached .npy files and sample windows to be equal. As in Megatron-Core, everything counts
sequences, not documents: the split is of sequence_lengths.shape[0] (GPTDataset's
numel_low_level_dataset) with the split matrix's rounding (round(cumulative weight * n)),
the document index shuffles sequence ids, build_sample_idx walks sequence_lengths, and
samples read sequences (IndexedDataset.get). The dataset has documents of several sequences
(--split-sentences) and documents with none. Also recomputes loom's numpy RandomState
shuffles with numpy itself.

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


def split_range(split, which, n):
    """blended_megatron_dataset_config: parse_and_normalize_split and
    convert_split_vector_to_split_matrix, then the builder's round(bookend * n)."""
    w = [float(x) for x in split.split(",")]
    w += [0.0] * (3 - len(w))
    w = np.array(w, dtype=np.float64)
    w = (w / np.sum(w)).tolist()
    ends = [0]
    for x in w:
        ends.append(ends[-1] + x)
    lo, hi = ends[which], ends[which + 1]
    assert hi > lo, "split not built"
    return int(round(lo * float(n))), int(round(hi * float(n)))


def main(out):
    lengths, pointers, doc_bounds, tokens, width = read_idx(out + "/docs")
    manifest = json.load(open(out + "/manifest.json"))
    per_doc = np.diff(doc_bounds)
    assert (per_doc == 0).any() and (per_doc > 1).any(), "dataset lacks empty or split documents"
    print(f"dataset: {len(doc_bounds) - 1} documents, {len(lengths)} sequences "
          f"({int((per_doc == 0).sum())} documents without, {int((per_doc > 1).sum())} with several)")
    for c in manifest["cases"]:
        begin, end = split_range(c["split"], c["which"], len(lengths))
        assert (begin, end) == (c["begin"], c["end"]), ((begin, end), c["begin"], c["end"])
        docs = np.arange(begin, end, dtype=np.int32)
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
        print(f"ok: {stem.split('/')[-1]}: sequences [{begin}, {end}), {epochs} epoch(s), "
              f"separate final epoch {separate}, {total} samples")
    for c in manifest["shuffles"]:
        want = np.arange(c["n"], dtype=np.dtype(c["dtype"]))
        np.random.RandomState(c["seed"]).shuffle(want)
        got = np.load(c["file"])
        assert got.dtype == want.dtype and np.array_equal(got, want), f"shuffle {c}"
        print(f"ok: RandomState({c['seed']}).shuffle(arange({c['n']})): first {want[:5].tolist()}")


if __name__ == "__main__":
    main(sys.argv[1])
