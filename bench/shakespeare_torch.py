#!/usr/bin/env python3
"""The Shakespeare-char recipe of bench/shakespeare.sh trained in PyTorch, nanoGPT's way: the
reference model (tests/reference/model.py) with nanoGPT's initialisation (normal 0.02, residual
output projections scaled by 1/sqrt(2 n_layer)), decay on every tensor of 2+ dimensions, nanoGPT's
get_lr, AdamW(0.9, 0.99), clipping at 1.0, random windows. It answers whether a figure of tlm's is
the recipe's or tlm's: it reports the same two validation figures as shakespeare.sh, the estimate
over 20 random batches (what nanoGPT prints) and the loss over the whole validation split
(consecutive windows, every token predicted once, as `tlm eval` does), and the wall time from
start to the last estimate (data preparation and the evaluations every 250 steps included, as in
shakespeare.sh; the whole-split pass after it is not).

usage: shakespeare_torch.py TEXT SEED [THREADS]
PRECISION=bf16 trains (and estimates) under torch.autocast("cpu", dtype=torch.bfloat16): mixed
precision the PyTorch way, the peer of tlm train --precision bf16.
"""
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
from model import Config, Model  # noqa: E402

STEPS = int(os.environ.get("STEPS", 2000))
WARMUP, LR, MIN_LR, B, T = 100, 1e-3, 1e-4, 12, 64


def get_lr(it):
    # nanoGPT's schedule (train.py, get_lr)
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it > STEPS:
        return MIN_LR
    ratio = (it - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def main():
    t_start = time.time()
    path, seed = sys.argv[1], int(sys.argv[2])
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]
    cfg = Config.from_dict({"vocab_size": len(chars), "context_length": T, "d_model": 128,
                            "n_layers": 4, "n_heads": 4, "norm": "layernorm",
                            "position": "learned", "ffn": "gelu", "bias": False,
                            "tie_embeddings": True, "dropout": 0.0})
    model = Model(cfg)
    with torch.no_grad():
        for name, p in model.canonical_params():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                std = 0.02
                if name.endswith("attn_output.weight") or name.endswith("ffn_down.weight"):
                    std /= math.sqrt(2 * cfg.n_layers)
                p.normal_(0.0, std)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.99), eps=1e-8)

    def batch(split):
        d = train if split == "train" else val
        ix = torch.randint(len(d) - T, (B,))
        return (torch.stack([d[i:i + T] for i in ix]), torch.stack([d[i + 1:i + 1 + T] for i in ix]))

    bf16 = os.environ.get("PRECISION", "fp32") == "bf16"

    def cast():
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def estimate():
        # 20 random validation batches, nanoGPT's estimate_loss with eval_iters=20
        model.eval()
        with torch.no_grad():
            est = 0.0
            for _ in range(20):
                x2, y2 = batch("val")
                with cast():
                    logits, _ = model(x2)
                est += F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size),
                                       y2.reshape(-1)).item() / 20
        model.train()
        return est

    model.train()
    for it in range(STEPS):
        if it > 0 and it % 250 == 0:
            estimate()  # as often as shakespeare.sh evaluates, so the wall times compare
        for g in opt.param_groups:
            g["lr"] = get_lr(it)
        x, y = batch("train")
        with cast():
            _, loss = model(x, targets=y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    est = estimate()
    wall_s = time.time() - t_start
    model.eval()
    with torch.no_grad():
        total, count = 0.0, 0
        for w in range(0, len(val) - 1, T):
            x = val[w:w + T]
            y = val[w + 1:w + 1 + T]
            x = x[:len(y)]
            with cast():
                logits, _ = model(x[None])
            total += F.cross_entropy(logits[0].float(), y, reduction="sum").item()
            count += len(y)
    print(json.dumps({"impl": "pytorch", "seed": seed, "val_loss_whole": round(total / count, 6),
                      "val_loss_20_batches": round(est, 6), "wall_s": round(wall_s, 1),
                      "threads": threads, "precision": "bf16" if bf16 else "fp32"}))


if __name__ == "__main__":
    main()
