#!/usr/bin/env python3
"""PyTorch peer for bench_model.c: the reference model (tests/reference/model.py) timed on the
same config, batch, threads and BLAS. Usage: torch_model.py forward|train CONFIG_JSON B T ITERS THREADS
PRECISION=bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) (oneDNN's bf16
matmuls; master weights and the optimizer stay fp32), the way a PyTorch user trains in mixed
precision on a CPU."""
import contextlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
from model import Config, Model  # noqa: E402


def main():
    mode, cfg_json, B, T, iters, threads = sys.argv[1:7]
    B, T, iters, threads = int(B), int(T), int(iters), int(threads)
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    cfg = Config.from_dict(json.loads(cfg_json))
    model = Model(cfg)
    model.init_weights()
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    tg = torch.randint(0, cfg.vocab_size, (B, T))
    train = mode == "train"
    if train:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1)
    else:
        model.eval()
    bf16 = os.environ.get("PRECISION", "fp32") == "bf16"
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    times = []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        if train:
            opt.zero_grad(set_to_none=True)
            with cast():
                _, loss = model(ids, targets=tg)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        else:
            with torch.no_grad(), cast():
                model(ids, targets=tg)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times[2:])
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"impl": "pytorch", "mode": mode, "tokens_per_s": round(B * T / med, 1),
                      "median_s": round(med, 5), "params": n_params, "threads": threads,
                      "precision": "bf16" if bf16 else "fp32"}))


if __name__ == "__main__":
    main()
