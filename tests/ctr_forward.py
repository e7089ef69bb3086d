"""Recomputes a pstrain CTR model's test AUC and logloss from its --export
file in numpy, independently of pstrain's code: parses the Criteo TSV,
makes the feature keys (common/criteo.c's formula), looks the rows up in the
exported tables (keys never trained read zeros) and runs Wide&Deep forward.

  ctr_forward.py EXPORT.safetensors TEST.tsv  ->  prints {"auc":..., "logloss":...}"""
import json
import sys

import numpy as np

from safetensors_read import load_any

M64 = (1 << 64) - 1


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def feature_key(field, text):
    base = 0xC7E0 << 48 | field << 33
    return mix64(base | (1 << 32 if text == "" else int(text, 16)))


def read_tsv(path):
    labels, dense, keys = [], [], []
    for line in open(path):
        f = line.rstrip("\n").rstrip("\r").split("\t")
        assert len(f) == 40, (path, len(f))
        labels.append(float(f[0]))
        dense.append([np.log1p(float(v)) if v != "" and int(v) > 0 else 0.0 for v in f[1:14]])
        keys.append([feature_key(i, v) for i, v in enumerate(f[14:40])])
    return (np.array(labels), np.array(dense, dtype=np.float32), keys)


def lookup(table_keys, table_rows, keys):
    index = {int(k): i for i, k in enumerate(table_keys)}
    dim = table_rows.shape[1]
    out = np.zeros((len(keys), 26, dim), dtype=np.float32)
    for e, row in enumerate(keys):
        for f, k in enumerate(row):
            i = index.get(k)
            if i is not None:
                out[e, f] = table_rows[i]
    return out


def auc(p, y):
    order = np.argsort(p, kind="mergesort")
    ps, ys = p[order], y[order]
    ranks = np.empty(len(p))
    i = 0
    while i < len(p):
        j = i
        while j < len(p) and ps[j] == ps[i]:
            j += 1
        ranks[i:j] = (i + 1 + j) / 2.0
        i = j
    pos = ys.sum()
    neg = len(ys) - pos
    return (ranks[ys > 0.5].sum() - pos * (pos + 1) / 2) / (pos * neg)


def main():
    t = load_any(sys.argv[1])
    y, dense, keys = read_tsv(sys.argv[2])
    wide = lookup(t["wide.keys"], t["wide.rows"], keys)[:, :, 0].sum(1) + t["wide.bias"][0]
    logit = wide.astype(np.float64)
    if "embedding.keys" in t:
        emb = lookup(t["embedding.keys"], t["embedding.rows"], keys)
        h = np.concatenate([emb.reshape(len(keys), -1), dense], axis=1).astype(np.float64)
        layers = sum(1 for k in t if k.startswith("fc") and k.endswith(".weight"))
        for l in range(1, layers + 1):
            h = h @ t[f"fc{l}.weight"].T.astype(np.float64) + t[f"fc{l}.bias"]
            if l < layers:
                h = np.maximum(h, 0)
        logit = logit + h[:, 0]
    p = 1 / (1 + np.exp(-logit))
    loss = np.mean(np.maximum(logit, 0) - y * logit + np.log1p(np.exp(-np.abs(logit))))
    print(json.dumps({"auc": auc(p.astype(np.float32), y), "logloss": float(loss),
                      "examples": len(y)}))


if __name__ == "__main__":
    main()
