#!/usr/bin/env python3
"""Optimizer fixtures: 10 AdamW steps of torch.optim.AdamW (with clip_grad_norm_ and a warmup +
cosine schedule) on the parameters of a small reference model, for tests/test_optim.c.

Writes OUTDIR/optim/config.json and OUTDIR/optim/optim.safetensors holding
  init.NAME            parameters before the first step
  grad.K.NAME          raw gradient fed at step K (before clipping)
  after.K.NAME         parameters after step K
  lr                   F32 [steps] learning rate used at each step
  norm                 F32 [steps] gradient norm clip_grad_norm_ returned
and metadata with the hyperparameters."""
import json
import math
import os
import sys

import torch

# Importing the modules beside this file leaves no __pycache__ in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Model  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

STEPS = 10
HP = dict(max_lr=3e-2, min_lr=3e-3, warmup=3, total=STEPS, beta1=0.9, beta2=0.95, eps=1e-8,
          weight_decay=0.1, clip=1.0)


def lr_at(step):
    """Written independently of the C code from the schedule's definition."""
    if step < HP["warmup"]:
        return HP["max_lr"] * (step + 1) / HP["warmup"]
    if step >= HP["total"] - 1:
        return HP["min_lr"]
    ratio = (step - HP["warmup"]) / (HP["total"] - 1 - HP["warmup"])
    return HP["min_lr"] + 0.5 * (1 + math.cos(math.pi * ratio)) * (HP["max_lr"] - HP["min_lr"])


def main(outdir):
    torch.set_num_threads(1)
    cfg = Config.from_dict(dict(vocab_size=40, context_length=8, d_model=16, n_layers=1, n_heads=2,
                                norm="layernorm", bias=True, tie_embeddings=False))
    gen = torch.Generator().manual_seed(7)
    model = Model(cfg)
    params = model.canonical_params()
    with torch.no_grad():
        for _, p in params:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    # Decay on matrices and embeddings, not on gains and biases (as the C schema says).
    decay = [p for _, p in params if p.dim() == 2]
    no_decay = [p for _, p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=HP["max_lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"])
    out = [("init." + n, p.detach().clone()) for n, p in params]
    lrs, norms = [], []
    for k in range(STEPS):
        # Gradient scale varies so that some steps clip and some don't.
        scale = [0.005, 0.04, 0.003, 0.03, 0.0002, 0.02, 0.001, 0.06, 0.002, 0.0001][k]
        for n, p in params:
            p.grad = torch.randn(p.shape, generator=gen) * scale
            out.append((f"grad.{k}.{n}", p.grad.clone()))
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], HP["clip"])
        lr = lr_at(k)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        lrs.append(lr)
        norms.append(float(norm))
        out += [(f"after.{k}.{n}", p.detach().clone()) for n, p in params]
    out += [("lr", torch.tensor(lrs, dtype=torch.float32)),
            ("norm", torch.tensor(norms, dtype=torch.float32))]
    d = os.path.join(outdir, "optim")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f, indent=2)
    write_safetensors(os.path.join(d, "optim.safetensors"), out,
                      metadata={k: repr(v) for k, v in HP.items()} | {"steps": str(STEPS)})
    print(f"optimizer fixture: {STEPS} AdamW steps, norms {', '.join(f'{x:.3f}' for x in norms)}")


if __name__ == "__main__":
    main(sys.argv[1])
