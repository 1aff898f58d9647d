"""Reads loom's .bin/.idx datasets the way Megatron's IndexedDataset does (numpy views on a
memory map at computed offsets) and checks them against what the writer says it wrote.

usage: check_indexed_numpy.py EXPECTED.json
The format, from Megatron-LM's megatron/core/datasets/indexed_dataset.py:
  .idx: b"MMIDIDX\\x00\\x00", <Q version 1, <B dtype code, <Q sequence count, <Q document
        count, int32[S] lengths, int64[S] byte pointers, int64[D] document indices
  .bin: the tokens back to back in the dtype
"""
import json
import struct
import sys

import numpy

INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


class IndexReader:
    """Megatron's _IndexReader logic."""

    def __init__(self, idx_path):
        with open(idx_path, "rb") as stream:
            header = stream.read(9)
            assert header == INDEX_HEADER, f"bad header, cannot read: {idx_path}"
            version = struct.unpack("<Q", stream.read(8))[0]
            assert version == 1, f"bad version, cannot read: {idx_path}"
            code = struct.unpack("<B", stream.read(1))[0]
            self.code = code
            self.dtype = DTYPES[code]
            self.dtype_size = numpy.dtype(self.dtype).itemsize
            self.sequence_count = struct.unpack("<Q", stream.read(8))[0]
            self.document_count = struct.unpack("<Q", stream.read(8))[0]
            offset = stream.tell()
        assert offset == 34
        self.buffer_mmap = numpy.memmap(idx_path, mode="r", order="C")
        self.buffer = memoryview(self.buffer_mmap)
        self.sequence_lengths = numpy.frombuffer(
            self.buffer, dtype=numpy.int32, count=self.sequence_count, offset=offset)
        self.sequence_pointers = numpy.frombuffer(
            self.buffer, dtype=numpy.int64, count=self.sequence_count,
            offset=offset + self.sequence_lengths.nbytes)
        self.document_indices = numpy.frombuffer(
            self.buffer, dtype=numpy.int64, count=self.document_count,
            offset=offset + self.sequence_lengths.nbytes + self.sequence_pointers.nbytes)
        end = (offset + self.sequence_lengths.nbytes + self.sequence_pointers.nbytes
               + self.document_indices.nbytes)
        assert end == len(self.buffer_mmap), f"{idx_path}: {len(self.buffer_mmap)} bytes, {end} expected"


class IndexedDataset:
    """Megatron's IndexedDataset with the mmap bin reader."""

    def __init__(self, prefix):
        self.index = IndexReader(prefix + ".idx")
        self.bin_mmap = numpy.memmap(prefix + ".bin", mode="r", order="C")
        self.bin = memoryview(self.bin_mmap)

    def __len__(self):
        return self.index.sequence_count

    def __getitem__(self, i):
        pointer, length = self.index.sequence_pointers[i], self.index.sequence_lengths[i]
        return numpy.frombuffer(self.bin, dtype=self.index.dtype, count=length, offset=pointer)

    def get(self, i, offset=0, length=None):
        pointer, seq_length = self.index.sequence_pointers[i], self.index.sequence_lengths[i]
        if length is None:
            length = seq_length - offset
        pointer += offset * self.index.dtype_size
        return numpy.frombuffer(self.bin, dtype=self.index.dtype, count=length, offset=pointer)


def check(expected):
    ds = IndexedDataset(expected["prefix"])
    name = expected["prefix"]
    assert ds.index.code == expected["dtype_code"], f"{name}: dtype code {ds.index.code}"
    assert len(ds) == expected["sequences"], f"{name}: {len(ds)} sequences"
    doc_index = numpy.array(expected["document_indices"], dtype=numpy.int64)
    assert ds.index.document_count == len(doc_index), f"{name}: document count"
    assert numpy.array_equal(ds.index.document_indices, doc_index), f"{name}: document indices"
    assert len(set(doc_index.tolist())) < len(doc_index), f"{name}: expected an empty document"
    lengths = numpy.array(expected["lengths"], dtype=numpy.int32)
    assert numpy.array_equal(ds.index.sequence_lengths, lengths), f"{name}: lengths differ"
    pointers = numpy.concatenate([[0], numpy.cumsum(lengths.astype(numpy.int64))[:-1]])
    assert numpy.array_equal(ds.index.sequence_pointers, pointers * ds.index.dtype_size), \
        f"{name}: pointers differ"
    assert len(ds.bin_mmap) == lengths.sum() * ds.index.dtype_size, f"{name}: .bin size"

    sums = [int(ds[i].astype(numpy.int64).sum()) for i in range(len(ds))]
    assert sums == expected["sums"], f"{name}: per-sequence sums differ"
    tokens = numpy.concatenate([ds[i] for i in range(len(ds))]).astype(numpy.int64)
    assert len(tokens) == expected["tokens"]
    weights = numpy.arange(len(tokens), dtype=numpy.int64) % 997 + 1
    weighted = int((tokens * weights).sum())
    assert weighted == expected["weighted"], f"{name}: weighted checksum {weighted} != {expected['weighted']}"
    # Megatron's partial reads (GPTDataset uses get(i, offset, length)).
    for i in range(min(len(ds), 20)):
        if lengths[i] >= 10:
            assert numpy.array_equal(ds.get(i, 3, 5), ds[i][3:8]), f"{name}: get({i}, 3, 5)"
    print(f"{name}: {len(doc_index) - 1} documents, {len(ds)} sequences, {len(tokens)} tokens, dtype {ds.index.dtype.__name__}: ok")


def main():
    with open(sys.argv[1]) as f:
        datasets = json.load(f)
    for expected in datasets:
        check(expected)


if __name__ == "__main__":
    main()
