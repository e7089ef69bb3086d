"""Reads a safetensors file into numpy arrays, independently of pstrain's
writer: an 8-byte little-endian header length, a JSON header, raw data."""
import json
import struct

import numpy as np


DTYPES = {"F32": "<f4", "U64": "<u8", "I64": "<i8"}


def load_any(path):
    """Every tensor, in whichever dtype pstrain wrote it (F32; sparse tables' keys U64)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def load(path):
    """load_any for pstrain's dense files: every tensor must be F32."""
    out = load_any(path)
    for name, a in out.items():
        assert a.dtype == np.float32, (name, a.dtype)
    return out


def max_difference(a, b, relative=False):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    worst = 0.0
    for k in a:
        d = float(np.abs(a[k] - b[k]).max())
        if relative:
            d /= float(np.abs(b[k]).max()) + 1e-30
        worst = max(worst, d)
    return worst
