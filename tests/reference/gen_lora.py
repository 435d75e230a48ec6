"""LoRA fixtures: the reference model with PEFT's LoRA on chosen linear layers, its logits, loss
and the gradient of every A and B (the base frozen), for tests/test_lora.c.

Usage: /usr/bin/python3 tests/reference/gen_lora.py OUTDIR   (gen_fixtures.py calls main)

For each case NAME: OUTDIR/lora/NAME/config.json, model.safetensors (the base, canonical names),
lora.safetensors (A and B as <base tensor>.lora_a [r, in] / .lora_b [out, r]) and io.safetensors
(ids, targets, logits, loss, grad.<lora tensor>), metadata rank, alpha, rslora, targets.
A LoRA layer computes what PEFT's lora.Linear does with dropout 0:
    y = base(x) + s * lora_B(lora_A(x)),  s = alpha / r  (rsLoRA: alpha / sqrt(r)).
B is random here (PEFT starts it at zero) so that every gradient is non-trivial.

dpo.safetensors: DPO (TRL's sigmoid loss with label smoothing and rpo_alpha) over P pairs, rows 2i chosen and
2i + 1 rejected, targets -1 on the prompt; the reference is the base (every adapter's scale 0),
its per-row log-probability sums ref_logp; the loss (mean over pairs) and the gradient of every A
and B, metadata beta, label_smoothing.
"""

import json
import math
import os
import sys

import torch
import torch.nn as nn

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import randomize  # noqa: E402
from model import Config, Model  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402


class LoraLinear(nn.Module):
    def __init__(self, base, r, scale, gen):
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(r, base.in_features, generator=gen) /
                                   math.sqrt(base.in_features))
        self.lora_B = nn.Parameter(0.3 * torch.randn(base.out_features, r, generator=gen) /
                                   math.sqrt(r))
        self.scale = scale

    def forward(self, x):
        return self.base(x) + self.scale * ((x @ self.lora_A.t()) @ self.lora_B.t())


CASES = [
    # Llama: GQA, SwiGLU, interleaved RoPE, untied head; every linear layer and the head.
    dict(name="llama", B=2, T=12, rank=4, alpha=8.0, rslora=False,
         targets=["q", "k", "v", "o", "gate", "up", "down", "head"],
         config=dict(vocab_size=128, context_length=32, d_model=64, n_layers=2, n_heads=4,
                     n_kv_heads=2, norm="rmsnorm", norm_eps=1e-6, ffn="swiglu",
                     position="rope", rope_pairing="interleaved", tie_embeddings=False,
                     bias=False)),
    # Post-norm LayerNorm, biases, ReLU, learned positions; some targets, rsLoRA.
    dict(name="post_bias_rslora", B=2, T=10, rank=4, alpha=6.0, rslora=True,
         targets=["q", "v", "down"],
         config=dict(vocab_size=70, context_length=24, d_model=48, n_layers=2, n_heads=4,
                     norm="layernorm", norm_position="post", ffn="relu", position="learned",
                     bias=True, tie_embeddings=False)),
    # Qwen2: q/k/v biases, halves RoPE, tied head; the blocks' layers.
    dict(name="qwen2", B=2, T=10, rank=8, alpha=16.0, rslora=False,
         targets=["q", "k", "v", "o", "gate", "up", "down"],
         config=dict(vocab_size=120, context_length=24, d_model=64, n_layers=2, n_heads=4,
                     n_kv_heads=2, norm="rmsnorm", norm_eps=1e-6, ffn="swiglu", position="rope",
                     rope_pairing="half", tie_embeddings=True, bias=False, qkv_bias=True)),
    # Gemma 2's layers (frozen passes through both caps, the post norms, GEGLU and the windowed
    # layers; the bf16 backward computes each head's capped scores again).
    dict(name="gemma2_like", B=2, T=20, rank=4, alpha=8.0, rslora=False,
         targets=["q", "k", "v", "o", "gate", "up", "down"],
         config=dict(vocab_size=96, context_length=32, d_model=64, n_layers=2, n_heads=4,
                     n_kv_heads=2, norm="rmsnorm", norm_eps=1e-6, ffn="geglu", position="rope",
                     tie_embeddings=True, sliding_window=5, sliding_window_pattern=2,
                     attn_softcap=1.5, final_softcap=4.0, embed_scale=8.0, attn_scale=0.2,
                     post_norms=True)),
]


def wrap(model, targets, r, scale, gen):
    """Puts LoraLinear around each target; returns [(base tensor name, LoraLinear)] in tlm's
    flat order (per layer q, k, v, o, gate, up, down; the head last)."""
    out = []
    for l, blk in enumerate(model.blocks):
        sites = [("q", blk.attn, "q", "attn_q"), ("k", blk.attn, "k", "attn_k"),
                 ("v", blk.attn, "v", "attn_v"), ("o", blk.attn, "o", "attn_output"),
                 ("gate", blk.ffn, "gate", "ffn_gate"), ("up", blk.ffn, "up", "ffn_up"),
                 ("down", blk.ffn, "down", "ffn_down")]
        for t, mod, attr, gguf in sites:
            if t in targets and getattr(mod, attr) is not None:
                lin = LoraLinear(getattr(mod, attr), r, scale, gen)
                setattr(mod, attr, lin)
                out.append((f"blk.{l}.{gguf}.weight", lin))
    if "head" in targets:
        lin = LoraLinear(model.output, r, scale, gen)
        model.output = lin
        out.append(("output.weight", lin))
    return out


DPO_BETA, DPO_LS, DPO_RPO, DPO_PAIRS = 0.5, 0.1, 0.3, 2


def row_logp(model, ids, targets):
    """Per row: the sum of the targets' log-probabilities (targets < 0 skipped)."""
    logits, _ = model(ids)
    lp = torch.log_softmax(logits.float(), dim=-1)
    mask = targets >= 0
    tok = torch.gather(lp, 2, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (tok * mask).sum(dim=1)


def dpo_case(model, sites, cfg, T, gen):
    P = DPO_PAIRS
    ids = torch.randint(0, cfg.vocab_size, (2 * P, T), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (2 * P, T), generator=gen)
    targets[:, :3] = -1  # the prompt
    targets[1, T - 2:] = -1  # a shorter rejected answer
    for _, lin in sites:
        lin.lora_A.grad = None
        lin.lora_B.grad = None
    scales = [lin.scale for _, lin in sites]
    with torch.no_grad():
        for _, lin in sites:
            lin.scale = 0.0
        ref = row_logp(model, ids, targets).float()
        for (_, lin), s in zip(sites, scales):
            lin.scale = s
    pi = row_logp(model, ids, targets)
    z = DPO_BETA * ((pi[0::2] - ref[0::2]) - (pi[1::2] - ref[1::2]))
    # RPO (TRL's rpo_alpha): the chosen answers' mean cross-entropy over the batch's tokens
    nll = -pi[0::2].sum() / (targets[0::2] >= 0).sum()
    loss = (-(1 - DPO_LS) * torch.nn.functional.logsigmoid(z) -
            DPO_LS * torch.nn.functional.logsigmoid(-z)).mean() + DPO_RPO * nll
    loss.backward()
    out = [("ids", ids.to(torch.int32)), ("targets", targets.to(torch.int32)),
           ("ref_logp", ref), ("loss", loss.detach().reshape(1).float())]
    for name, lin in sites:
        for k, p in (("a", lin.lora_A), ("b", lin.lora_B)):
            out.append((f"grad.{name}.lora_{k}", p.grad.float()))
    return out, loss.item()


def main(outdir):
    root = os.path.join(outdir, "lora")
    os.makedirs(root, exist_ok=True)
    for index, c in enumerate(CASES):
        cfg = Config.from_dict(dict(c["config"]))
        torch.manual_seed(3000 + index)
        gen = torch.Generator().manual_seed(3000 + index)
        model = Model(cfg)
        randomize(model, gen)
        model.eval()
        base = [(n, t.detach().clone().float()) for n, t in model.state_dict_canonical().items()]
        for p in model.parameters():
            p.requires_grad_(False)
        r = c["rank"]
        scale = c["alpha"] / (math.sqrt(r) if c["rslora"] else r)
        sites = wrap(model, c["targets"], r, scale, gen)
        B, T = c["B"], c["T"]
        ids = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
        targets = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
        logits, loss = model(ids, targets=targets)
        loss.backward()
        lora, grads = [], []
        for name, lin in sites:
            for k, p in (("a", lin.lora_A), ("b", lin.lora_B)):
                lora.append((f"{name}.lora_{k}", p.detach().float()))
                grads.append((f"grad.{name}.lora_{k}", p.grad.float()))
        d = os.path.join(root, c["name"])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg.to_dict(), f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(d, "model.safetensors"), base)
        meta = {"rank": str(r), "alpha": repr(c["alpha"]), "rslora": str(int(c["rslora"])),
                "targets": ",".join(c["targets"]), "B": str(B), "T": str(T)}
        write_safetensors(os.path.join(d, "lora.safetensors"), lora, metadata=meta)
        write_safetensors(os.path.join(d, "io.safetensors"),
                          [("ids", ids.to(torch.int32)), ("targets", targets.to(torch.int32)),
                           ("logits", logits.detach().float()),
                           ("loss", loss.detach().reshape(1).float())] + grads, metadata=meta)
        dpo = dpo_case(model, sites, cfg, T, gen)
        write_safetensors(os.path.join(d, "dpo.safetensors"), dpo[0],
                          metadata={"beta": repr(DPO_BETA), "label_smoothing": repr(DPO_LS),
                                    "rpo_alpha": repr(DPO_RPO),
                                    "P": str(DPO_PAIRS), "T": str(T)})
        print(f"lora {c['name']:20s} {len(sites)} matrices loss={loss.item():.4f} "
              f"dpo={dpo[1]:.4f}")
    with open(os.path.join(root, "cases.txt"), "w") as f:
        f.write("".join(c["name"] + "\n" for c in CASES))


if __name__ == "__main__":
    main(sys.argv[1])
