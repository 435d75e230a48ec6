"""load_file of the safetensors package: the 8-byte little-endian header length, the JSON header
(dtype, shape, data_offsets of each tensor) and the data after it."""
import json
import struct

import torch

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def load_file(path, device="cpu"):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        dtype = _DTYPES[t["dtype"]]
        data = bytearray(raw[8 + n + begin:8 + n + end])
        flat = torch.frombuffer(data, dtype=dtype) if data else torch.zeros(0, dtype=dtype)
        tensors[name] = flat.reshape(t["shape"]).to(device)
    return tensors
