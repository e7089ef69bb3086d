"""Steady-state training steps of a pstrain network file in PyTorch: the same
layers (torch.nn, NCHW float32), forward, cross-entropy, backward and a
momentum-SGD step over random images already in memory, as bench_net times
pstrain. Prints one JSON line.
  bench_net_torch.py NET_FILE C H W BATCH THREADS SECONDS
"""
import json
import sys
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, body, shortcut):
        super().__init__()
        self.body = nn.Sequential(*body)
        self.shortcut = nn.Sequential(*shortcut)

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


def build(path, c, h, w):
    """The file's layers as modules (one pass over the text, tracking shapes)."""
    layers, stack = [], None  # stack: a block's body, then its shortcut
    shape, block_shape = [c, h, w], None
    for raw in open(path):
        words = raw.split("#")[0].split()
        if not words or words[0] in ("name", "input"):
            continue
        op, opts = words[0], {}
        args = words[1:]
        i = 2 if op == "conv" else 1 if op == "maxpool" else len(args)
        while i < len(args):
            if args[i] == "nobias":
                opts["nobias"] = True
                i += 1
            else:
                opts[args[i]] = int(args[i + 1])
                i += 2
        target = layers if stack is None else stack[-1]
        if op == "conv":
            out, (kh, kw) = int(args[0]), (int(v) for v in args[1].split("x"))
            s, p = opts.get("stride", 1), opts.get("pad", 0)
            target.append(nn.Conv2d(shape[0], out, (kh, kw), s, p, bias=not opts.get("nobias")))
            shape = [out, (shape[1] + 2 * p - kh) // s + 1, (shape[2] + 2 * p - kw) // s + 1]
        elif op == "bn":
            target.append(nn.BatchNorm2d(shape[0]) if len(shape) == 3 else nn.BatchNorm1d(shape[0]))
        elif op == "relu":
            target.append(nn.ReLU())
        elif op == "maxpool":
            kh, kw = (int(v) for v in args[0].split("x"))
            s, p = opts.get("stride", kh), opts.get("pad", 0)
            target.append(nn.MaxPool2d((kh, kw), s, p))
            shape = [shape[0], (shape[1] + 2 * p - kh) // s + 1, (shape[2] + 2 * p - kw) // s + 1]
        elif op == "avgpool":
            target.append(nn.AdaptiveAvgPool2d(1))
            target.append(nn.Flatten())
            shape = [shape[0]]
        elif op == "flatten":
            target.append(nn.Flatten())
            shape = [shape[0] * (shape[1] if len(shape) > 1 else 1) * (shape[2] if len(shape) > 2 else 1)]
        elif op == "fc":
            if len(shape) > 1:
                target.append(nn.Flatten())
                shape = [shape[0] * shape[1] * shape[2]]
            target.append(nn.Linear(shape[0], int(args[0])))
            shape = [int(args[0])]
        elif op == "block":
            stack, block_shape = [[]], list(shape)
        elif op == "shortcut":
            stack.append([])
            shape = list(block_shape)
        elif op == "end":
            layers.append(Block(stack[0], stack[1] if len(stack) > 1 else []))
            stack = None
    return nn.Sequential(*layers)


def main():
    path, c, h, w, batch, threads, seconds = sys.argv[1:8]
    c, h, w, batch, threads, seconds = int(c), int(h), int(w), int(batch), int(threads), float(seconds)
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    net = build(path, c, h, w)
    x = torch.rand(batch, c, h, w)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps < 3:
        step()
        steps += 1
    elapsed = time.perf_counter() - start
    print(json.dumps({"network": path, "batch": batch, "threads": threads, "steps": steps,
                      "seconds": round(elapsed, 3), "samples_per_s": round(steps * batch / elapsed, 1),
                      "parameters": sum(p.numel() for p in net.parameters()),
                      "torch": torch.__version__, "mkldnn": torch.backends.mkldnn.is_available()}))


if __name__ == "__main__":
    main()
