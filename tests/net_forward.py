"""A network file's forward pass in numpy, written from the format's
description (docs/models-and-data.md: Convolutional networks), not from pstrain's C: reads
an exported model (safetensors) and the test images, prints the accuracy.

  net_forward.py NET_FILE EXPORT.safetensors DATA_DIR COUNT
"""
import gzip
import os
import sys

import numpy as np

from safetensors_read import load

EPS = 1e-5  # batch norm's, as PyTorch's


def parse(path):
    """The layers of a model file as (op, dict of its settings)."""
    layers, shape = [], None
    for raw in open(path):
        words = raw.split("#")[0].split()
        if not words or words[0] == "name":
            continue
        if words[0] == "input":
            shape = tuple(int(v) for v in words[1].split("x"))
            continue
        op, opts = words[0], {}
        if op == "conv":
            opts["out"] = int(words[1])
            opts["k"] = tuple(int(v) for v in words[2].split("x"))
            opts.update(stride=1, pad=0, bias=True)
            rest = words[3:]
        elif op == "maxpool":
            opts["k"] = tuple(int(v) for v in words[1].split("x"))
            opts.update(stride=opts["k"][0], pad=0)
            rest = words[2:]
        elif op == "fc":
            opts["out"] = int(words[1])
            rest = []
        else:
            rest = []
        i = 0
        while i < len(rest):
            if rest[i] == "nobias":
                opts["bias"] = False
                i += 1
            else:
                opts[rest[i]] = int(rest[i + 1])
                i += 2
        layers.append((op, opts))
    return shape, layers


def conv(x, w, b, stride, pad):
    n, c, h, wd = x.shape
    k, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, k, oh, ow), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            y += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j])
    if b is not None:
        y += b[None, :, None, None]
    return y


def maxpool(x, k, stride, pad):
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    oh, ow = (h + 2 * pad - k[0]) // stride + 1, (w + 2 * pad - k[1]) // stride + 1
    y = np.full((n, c, oh, ow), -np.inf)
    for i in range(k[0]):
        for j in range(k[1]):
            y = np.maximum(y, xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride])
    return y


def forward(layers, p, x):
    counts = {"conv": 0, "bn": 0, "fc": 0}
    block_in, body = None, None
    for op, o in layers:
        if op in counts:
            counts[op] += 1
            name = "%s%d" % (op, counts[op])
        if op == "conv":
            x = conv(x, p[name + ".weight"], p.get(name + ".bias") if o["bias"] else None,
                     o["stride"], o["pad"])
        elif op == "bn":
            shape = (1, -1) + (1,) * (x.ndim - 2)
            inv = 1.0 / np.sqrt(p[name + ".running_var"].astype(np.float64) + EPS)
            x = (x - p[name + ".running_mean"].reshape(shape)) * inv.reshape(shape)
            x = x * p[name + ".weight"].reshape(shape) + p[name + ".bias"].reshape(shape)
        elif op == "relu":
            x = np.maximum(x, 0)
        elif op == "maxpool":
            x = maxpool(x, o["k"], o["stride"], o["pad"])
        elif op == "avgpool":
            x = x.mean(axis=(2, 3))
        elif op == "flatten":
            x = x.reshape(x.shape[0], -1)
        elif op == "fc":
            x = x.reshape(x.shape[0], -1) @ p[name + ".weight"].T.astype(np.float64) + p[name + ".bias"]
        elif op == "block":
            block_in, body = x, None
        elif op == "shortcut":
            body, x = x, block_in
        elif op == "end":
            x = (body if body is not None else x) + (x if body is not None else block_in)
    return x


def images(data_dir, count):
    with gzip.open(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")) as f:
        raw = f.read()
    n, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    x = np.frombuffer(raw[16:], dtype=np.uint8).reshape(n, 1, rows, cols)[:count]
    with gzip.open(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read()[8:], dtype=np.uint8)[:count]
    return x.astype(np.float32) * np.float32(1.0 / 255.0), labels


def main():
    net_file, export, data_dir, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    _, layers = parse(net_file)
    params = load(export)
    x, labels = images(data_dir, count)
    correct = 0
    for at in range(0, count, 250):
        logits = forward(layers, params, x[at:at + 250].astype(np.float64))
        correct += int((logits.argmax(axis=1) == labels[at:at + 250]).sum())
    print("%.4f" % (correct / count))


if __name__ == "__main__":
    main()
