"""Split a GGUF file into shards as llama.cpp's llama-gguf-split --split-max-tensors N does:
PREFIX-00001-of-0000K.gguf holds every key of the input plus split.no (u16),
split.tensors.count (i32) and split.count (u16), in that order; the others only the three split keys; each shard N tensors, in
the input's order, its data aligned as the input's.

Usage: /usr/bin/python3 tests/reference/gguf_split.py IN.gguf PREFIX MAX_TENSORS
"""

import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read(path):
    b = open(path, "rb").read()
    assert b[:4] == b"GGUF", "not a GGUF file"
    version, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    p = 24
    kv_start = p
    align = 32

    def string(p):
        n = struct.unpack_from("<Q", b, p)[0]
        return b[p + 8:p + 8 + n], p + 8 + n

    def value(t, p):
        if t == 8:
            return string(p)
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            for _ in range(n):
                _, p = value(et, p)
            return None, p
        return b[p:p + SIZES[t]], p + SIZES[t]

    for _ in range(n_kv):
        key, p = string(p)
        t = struct.unpack_from("<I", b, p)[0]
        v, p = value(t, p + 4)
        if key == b"general.alignment":
            align = struct.unpack("<I", v)[0]
    kv_bytes = b[kv_start:p]
    tensors = []
    for _ in range(n_t):
        name, p = string(p)
        nd = struct.unpack_from("<I", b, p)[0]
        dims = struct.unpack_from("<%dQ" % nd, b, p + 4)
        typ, off = struct.unpack_from("<IQ", b, p + 4 + 8 * nd)
        p += 4 + 8 * nd + 12
        tensors.append([name, dims, typ, off])
    data = p + (-p % align)
    for i, t in enumerate(tensors):
        end = tensors[i + 1][3] if i + 1 < len(tensors) else len(b) - data
        t.append(b[data + t[3]:data + end])  # the tensor's bytes with their padding
    return version, n_kv, kv_bytes, tensors, align


def kv(key, fmt, typ, val):
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", typ) + struct.pack(fmt, val)


def main():
    src, prefix, per = sys.argv[1], sys.argv[2], int(sys.argv[3])
    version, n_kv, kv_bytes, tensors, align = read(src)
    groups = [tensors[i:i + per] for i in range(0, len(tensors), per)]
    for k, group in enumerate(groups):
        split = (kv("split.no", "<H", 2, k) + kv("split.tensors.count", "<i", 5, len(tensors)) +
                 kv("split.count", "<H", 2, len(groups)))
        keys = (kv_bytes if k == 0 else b"") + split
        infos, blob = b"", b""
        for name, dims, typ, _, data in group:
            infos += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
            infos += struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", typ, len(blob))
            blob += data + b"\0" * (-len(data) % align)
        head = b"GGUF" + struct.pack("<IQQ", version, len(group), (n_kv if k == 0 else 0) + 3)
        head += keys + infos
        head += b"\0" * (-len(head) % align)
        with open("%s-%05d-of-%05d.gguf" % (prefix, k + 1, len(groups)), "wb") as f:
            f.write(head + blob)


if __name__ == "__main__":
    main()
