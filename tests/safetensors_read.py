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


def ctr_export_difference(a, b):
    """Largest relative difference between two CTR exports (dicts from
    load_any): the same tensor names and, per table, the same key set; rows
    compared key by key, whatever order each file holds them in."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    worst = 0.0
    for k in a:
        if k.endswith(".keys"):
            continue
        x, y = a[k], b[k]
        if k.endswith(".rows"):
            t = k[: -len(".rows")]
            ka, kb = a[t + ".keys"], b[t + ".keys"]
            assert len(ka) == len(kb) and set(ka.tolist()) == set(kb.tolist()), \
                f"{t}: the key sets differ"
            x, y = x[np.argsort(ka)], y[np.argsort(kb)]
        worst = max(worst, float(np.abs(x - y).max()) / (float(np.abs(y).max()) + 1e-30))
    return worst


if __name__ == "__main__":
    # safetensors_read.py compare-ctr A B TOLERANCE: exits 1 when the exports differ by more.
    import sys
    if len(sys.argv) != 5 or sys.argv[1] != "compare-ctr":
        sys.exit("usage: safetensors_read.py compare-ctr A B TOLERANCE")
    d = ctr_export_difference(load_any(sys.argv[2]), load_any(sys.argv[3]))
    print(f"max relative |{sys.argv[2]} - {sys.argv[3]}| = {d:.3g}")
    if d > float(sys.argv[4]):
        sys.exit(f"the exports differ by {d} (relative), more than {sys.argv[4]}")
