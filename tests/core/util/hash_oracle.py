#!/usr/bin/env python3
# Run with either Python (no imports): prints hash64 of the vectors in hash_test.cc.
# An independent oracle for core/util/hash.cc's hash64 (Python integers, mod 2^64).
M = (1 << 64) - 1
def rotl(x, r): return ((x << r) | (x >> (64 - r))) & M
def word(h, w):
    w = (w * 0x87c37b91114253d5) & M
    w = rotl(w, 31)
    w = (w * 0x4cf5ad432745937f) & M
    h ^= w
    return (rotl(h, 27) * 5 + 0x52dce729) & M
def finish(h):
    h ^= h >> 33; h = (h * 0xff51afd7ed558ccd) & M
    h ^= h >> 33; h = (h * 0xc4ceb9fe1a85ec53) & M
    h ^= h >> 33; return h
def hash64(b, seed=0):
    h = seed ^ 0x9e3779b97f4a7c15
    n = len(b); whole = n & ~7
    for i in range(0, whole, 8): h = word(h, int.from_bytes(b[i:i+8], 'little'))
    if n > whole: h = word(h, int.from_bytes(b[whole:] + bytes(8 - (n - whole)), 'little'))
    return finish(h ^ n)
for s in [b"", b"a", b"loom", b"abcdefgh", b"abcdefghi", bytes(range(256)) * 3]:
    print(s[:12], len(s), hex(hash64(s)))
print("seed7", hex(hash64(b"loom", 7)))
