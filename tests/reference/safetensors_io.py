"""Minimal safetensors reader/writer in pure Python + numpy (no `safetensors` package).

File layout (https://github.com/huggingface/safetensors):
    u64 little-endian N | N bytes of JSON header | raw tensor data
The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets are
relative to the start of the data section) and may carry "__metadata__": {str: str}. We pad the
JSON with spaces so the data section starts at a multiple of 8 bytes, and we lay tensors out in
the order they are given, back to back, so the file is byte-for-byte predictable.

Tensors may be numpy arrays or torch tensors. BF16 has no numpy dtype: to write BF16 pass a
torch.bfloat16 tensor; on reading, BF16 comes back as float32 (a lossless widening).
"""

import json
import struct

import numpy as np

# safetensors dtype name -> (numpy dtype used for the raw bytes, bytes per element)
_DTYPES = {
    "F32": np.dtype("<f4"),
    "I32": np.dtype("<i4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bit pattern; widened to float32 on read
}


def _to_raw(value):
    """Return (dtype name, little-endian numpy array of the raw elements) for one tensor."""
    try:
        import torch
    except ImportError:  # the writer works without torch for numpy inputs
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            # numpy cannot hold bfloat16; reinterpret the 16-bit patterns instead.
            return "BF16", t.view(torch.int16).numpy().view("<u2")
        value = t.numpy()
    arr = np.asarray(value)
    if arr.dtype == np.float32:
        return "F32", arr.astype("<f4", copy=False)
    if arr.dtype == np.int32:
        return "I32", arr.astype("<i4", copy=False)
    if arr.dtype == np.float16:
        return "F16", arr.astype("<f2", copy=False)
    raise TypeError(f"unsupported dtype {arr.dtype}; convert to float32/int32/float16 first")


def write_safetensors(path, tensors, metadata=None):
    """Write `tensors` (dict or list of (name, tensor) pairs, in that order) to `path`."""
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("safetensors metadata must map str -> str")
        header["__metadata__"] = dict(metadata)
    blobs = []
    offset = 0
    for name, value in items:
        if name == "__metadata__" or name in header:
            raise ValueError(f"bad or duplicate tensor name {name!r}")
        dtype, raw = _to_raw(value)
        data = np.ascontiguousarray(raw).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": [int(s) for s in raw.shape],
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)  # data section starts 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for data in blobs:
            f.write(data)


def read_header(path):
    """Return (header dict without __metadata__, metadata dict, data section start offset)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    return header, metadata, 8 + n


def read_safetensors(path):
    """Return (OrderedDict name -> numpy array, metadata dict). Checks sizes and offsets."""
    header, metadata, start = read_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        blob = f.read()
    # Keep file order (by begin offset) so callers see the writer's order.
    order = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    out = {}
    for name, info in order:
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise ValueError(f"{name}: unsupported dtype {dtype}")
        shape = tuple(int(s) for s in info["shape"])
        begin, end = info["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= begin <= end <= len(blob)) or end - begin != count * _DTYPES[dtype].itemsize:
            raise ValueError(f"{name}: data_offsets {begin}..{end} do not fit shape {shape} {dtype}")
        arr = np.frombuffer(blob[begin:end], dtype=_DTYPES[dtype]).reshape(shape).copy()
        if dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    return out, metadata
