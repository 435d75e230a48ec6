#!/usr/bin/env python3
"""PyTorch peer for bench/finetune/finetune.sh: a plain LoRA training loop, as a PyTorch user
writes one with PEFT's layers, on the reference model (tests/reference/model.py) of the same
config widened to F32: every linear layer of the blocks gets y = W x + s B (A x) (rank R, alpha
2R), the base frozen, AdamW over A and B only.

usage: torch_lora.py CONFIG_JSON B T STEPS THREADS RANK
PRECISION=bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16).
Prints one JSON line: median tokens/s over the steps after the first two, peak RSS (MiB)."""
import contextlib
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "reference"))
from model import Config, Model  # noqa: E402


class LoraLinear(nn.Module):
    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + self.scale * ((x @ self.lora_A.t()) @ self.lora_B.t())


def main():
    cfg_json, B, T, steps, threads, rank = sys.argv[1:7]
    B, T, steps, threads, rank = int(B), int(T), int(steps), int(threads), int(rank)
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    cfg = Config.from_dict(json.loads(cfg_json))
    model = Model(cfg)
    model.init_weights()
    for p in model.parameters():
        p.requires_grad_(False)
    for blk in model.blocks:
        for mod, names in ((blk.attn, ("q", "k", "v", "o")), (blk.ffn, ("gate", "up", "down"))):
            for n in names:
                if getattr(mod, n) is not None:
                    setattr(mod, n, LoraLinear(getattr(mod, n), rank, 2.0 * rank))
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    opt = torch.optim.AdamW(params, lr=2e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    bf16 = os.environ.get("PRECISION", "fp32") == "bf16"
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    tg = torch.randint(0, cfg.vocab_size, (B, T))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with cast():
            _, loss = model(ids, targets=tg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times[2:] if len(times) > 3 else times)
    print(json.dumps({"tokens_per_s": B * T / med, "trainable": sum(p.numel() for p in params),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "precision": "bf16" if bf16 else "fp32"}))


if __name__ == "__main__":
    main()
