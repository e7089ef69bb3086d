#!/usr/bin/python3
"""PyTorch baseline for pstrain's CTR models (the benchmark compares against it).

Wide&Deep as pstrain's `--model ctr:DIM:H1,H2`: per categorical field the key of
(field, value) (an empty value is its field's own key; test values unseen in
training share one "unknown" row per field) indexes a wide nn.Embedding(N, 1,
sparse=True) (zeros) and a deep nn.Embedding(N, DIM, sparse=True) (uniform
+-0.01); the 26 deep vectors and the 13 features log1p(x) (0 when missing or
<= 0) feed Linear-ReLU-...-Linear(1); logit = bias + sum of wide weights + MLP;
BCEWithLogits. `--model lr` is the wide part and the bias alone. Embeddings:
torch.optim.Adagrad (lr --sparse-lr, initial_accumulator_value 0, eps 1e-8);
dense parameters (MLP and bias): Adam (lr --lr). Batches in file order.

The files are parsed into tensors before training (not timed); examples_per_s
counts training steps only. Prints one JSON line per epoch.
"""
import argparse
import gzip
import json
import os
import resource
import sys
import time


def _threads_from_argv():
    """--threads, read before torch loads: Debian's torch calls the system BLAS
    (OpenBLAS), whose own thread pool ignores torch.set_num_threads and would
    take every core."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _threads_from_argv()

import numpy as np  # noqa: E402
import torch  # noqa: E402

NI, NC = 13, 26
CHUNK = 200_000


def open_text(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def hex_values(col):
    """S16 array of 8 hex digits or b'' -> int64 values, -1 where empty."""
    u8 = col.astype("S8").view(np.uint8).reshape(-1, 8).astype(np.int64)
    nib = np.where(u8 >= ord("a"), u8 - ord("a") + 10, u8 - ord("0"))
    val = np.zeros(len(col), dtype=np.int64)
    for k in range(8):
        val = val * 16 + nib[:, k]
    return np.where(col == b"", -1, val)


def read_tsv(path):
    """Labels (float32), dense log1p features (float32 [n,13]) and categorical
    values (int64 [n,26], -1 when empty)."""
    labels, dense, cats = [], [], []
    with open_text(path) as f:
        while True:
            lines = f.readlines(CHUNK * 200)
            if not lines:
                break
            flat = b"".join(lines).replace(b"\n", b"\t").split(b"\t")
            if flat[-1] == b"":
                flat.pop()
            a = np.array(flat, dtype="S16").reshape(-1, 1 + NI + NC)
            labels.append(a[:, 0].astype(np.float32))
            ints = np.where(a[:, 1:1 + NI] == b"", b"0", a[:, 1:1 + NI]).astype(np.int64)
            dense.append(np.log1p(np.maximum(ints, 0)).astype(np.float32))
            cats.append(np.stack([hex_values(a[:, 1 + NI + j]) for j in range(NC)], axis=1))
    return np.concatenate(labels), np.concatenate(dense), np.concatenate(cats)


def build_index(train_cats):
    """Per field: the sorted distinct values seen in training (missing, -1,
    included), and each field's offset in the tables; each field's last row
    is its unknown row."""
    uniq, offsets, total = [], [], 0
    for j in range(NC):
        u = np.unique(train_cats[:, j])
        uniq.append(u)
        offsets.append(total)
        total += len(u) + 1
    return uniq, offsets, total


def to_keys(cats, uniq, offsets):
    keys = np.empty(cats.shape, dtype=np.int64)
    for j in range(NC):
        u = uniq[j]
        pos = np.searchsorted(u, cats[:, j])
        pos_c = np.minimum(pos, len(u) - 1)
        found = u[pos_c] == cats[:, j]
        keys[:, j] = offsets[j] + np.where(found, pos_c, len(u))
    return keys


class WideDeep(torch.nn.Module):
    def __init__(self, n, dim, hidden, deep):
        super().__init__()
        self.wide = torch.nn.Embedding(n, 1, sparse=True)
        torch.nn.init.zeros_(self.wide.weight)
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.deep = None
        if deep:
            self.deep = torch.nn.Embedding(n, dim, sparse=True)
            torch.nn.init.uniform_(self.deep.weight, -0.01, 0.01)
            layers, width = [], NC * dim + NI
            for h in hidden:
                layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
                width = h
            layers.append(torch.nn.Linear(width, 1))
            self.mlp = torch.nn.Sequential(*layers)

    def forward(self, keys, dense):
        logit = self.wide(keys).sum(dim=(1, 2)) + self.bias
        if self.deep is not None:
            x = torch.cat([self.deep(keys).flatten(1), dense], dim=1)
            logit = logit + self.mlp(x).squeeze(1)
        return logit


def auc(scores, labels):
    """Exact rank AUC, tied scores sharing their average rank."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    avg_rank = first + (counts + 1) / 2.0
    ranks = np.repeat(avg_rank, counts)
    pos = y.sum()
    neg = len(y) - pos
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--model", choices=["ctr", "lr"], default="ctr")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sparse-lr", type=float, default=0.05)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    t0 = time.time()
    ytr, dtr, ctr = read_tsv(a.train)
    yte, dte, cte = read_tsv(a.test)
    uniq, offsets, n = build_index(ctr)
    ktr = torch.from_numpy(to_keys(ctr, uniq, offsets))
    kte = torch.from_numpy(to_keys(cte, uniq, offsets))
    del ctr, cte
    ytr, dtr, dte = torch.from_numpy(ytr), torch.from_numpy(dtr), torch.from_numpy(dte)
    print(f"ctr_torch: {len(ytr)} train rows, {len(yte)} test rows, {n} table rows, "
          f"parsed in {time.time() - t0:.1f} s", file=sys.stderr)

    model = WideDeep(n, a.dim, [int(h) for h in a.hidden.split(",") if h], a.model == "ctr")
    sparse = [model.wide.weight] + ([model.deep.weight] if model.deep is not None else [])
    dense_params = [model.bias] + (list(model.mlp.parameters()) if model.deep is not None else [])
    opt_sparse = torch.optim.Adagrad(sparse, lr=a.sparse_lr, initial_accumulator_value=0.0, eps=1e-8)
    opt_dense = torch.optim.Adam(dense_params, lr=a.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    for epoch in range(1, a.epochs + 1):
        model.train()
        start = time.time()
        for i in range(0, len(ytr), a.batch):
            logit = model(ktr[i:i + a.batch], dtr[i:i + a.batch])
            loss = loss_fn(logit, ytr[i:i + a.batch])
            opt_sparse.zero_grad()
            opt_dense.zero_grad()
            loss.backward()
            opt_sparse.step()
            opt_dense.step()
        train_s = time.time() - start
        model.eval()
        with torch.no_grad():
            z = torch.cat([model(kte[i:i + 8192], dte[i:i + 8192]) for i in range(0, len(yte), 8192)])
            p = torch.sigmoid(z).double().numpy()
        p = np.clip(p, 1e-12, 1 - 1e-12)
        logloss = float(-np.mean(yte * np.log(p) + (1 - yte) * np.log1p(-p)))
        print(json.dumps({"epoch": epoch, "model": a.model, "examples_per_s": round(len(ytr) / train_s, 1),
                          "train_seconds": round(train_s, 2), "auc": round(auc(p, yte), 5),
                          "logloss": round(logloss, 5),
                          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                          "threads": a.threads, "batch": a.batch}), flush=True)


if __name__ == "__main__":
    main()
