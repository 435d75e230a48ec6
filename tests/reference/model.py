"""Plain-PyTorch reference for tlm's decoder-only Transformer.

Written for clarity, not speed: every op is spelled out (no fused attention, no F.layer_norm, no
F.gelu) so it can be read side by side with the C kernels. The config semantics, parameter names
and parameter order match the C side (see /work/shared/DESIGN.md and tests/reference/README.md).

Run with Debian's PyTorch: /usr/bin/python3.
"""

import json
import math
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_default_dtype(torch.float32)

NORMS = ("rmsnorm", "layernorm")
NORM_POSITIONS = ("pre", "post")
FFNS = ("swiglu", "gelu", "gelu_tanh", "relu", "geglu")
POSITIONS = ("rope", "learned", "sinusoidal", "none")
ROPE_PAIRINGS = ("half", "interleaved")


# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------


def default_d_ff(d_model, ffn):
    """swiglu: ceil(8*d/3) rounded up to a multiple of 64 (keeps the parameter count close to a
    4*d GELU FFN with 3 matrices instead of 2). Others: 4*d. Integer arithmetic only."""
    if ffn in ("swiglu", "geglu"):
        ceil_8d_3 = (8 * d_model + 2) // 3
        return (ceil_8d_3 + 63) // 64 * 64
    return 4 * d_model


@dataclass
class Config:
    vocab_size: int = 0
    context_length: int = 0
    d_model: int = 0
    n_layers: int = 0
    n_heads: int = 0
    n_kv_heads: Optional[int] = None  # None -> n_heads
    d_ff: Optional[int] = None  # None -> default_d_ff(d_model, ffn)
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5
    norm_position: str = "pre"
    ffn: str = "swiglu"
    position: str = "rope"
    rope_theta: float = 10000.0
    rope_pairing: str = "half"
    tie_embeddings: bool = True
    bias: bool = False
    qkv_bias: bool = False
    dropout: float = 0.0
    sliding_window: int = 0  # 0: none; else a windowed layer's query sees its last W keys
    sliding_window_pattern: int = 0  # 0: every layer windowed; P: layer l global iff (l+1) % P == 0
    # Gemma 2's layer features (0 / False: off), computed as Hugging Face's Gemma2 modeling does.
    attn_softcap: float = 0.0  # scores become cap * tanh(scores / cap) before the mask
    final_softcap: float = 0.0  # logits become cap * tanh(logits / cap)
    embed_scale: float = 0.0  # the token embedding times it (0: 1); a tied head reads it unscaled
    attn_scale: float = 0.0  # the scores' scale (0: 1 / sqrt(head_dim))
    post_norms: bool = False  # norms on the attention and FFN outputs before the residual adds
    # Mixture of experts (0: a dense FFN), computed as Hugging Face's Mixtral / OLMoE / Qwen2-MoE
    # sparse blocks do: softmax router, top n_experts_used (ties: the lower index), weights
    # renormalised over the chosen with expert_weights_norm, a sigmoid-gated shared expert.
    n_experts: int = 0
    n_experts_used: int = 0
    expert_d_ff: int = 0  # 0: d_ff
    expert_weights_norm: bool = False
    n_shared_experts: int = 0
    router_aux_loss_coef: float = 0.0
    router_z_loss_coef: float = 0.0

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(unknown)}")
        required = ("vocab_size", "context_length", "d_model", "n_layers", "n_heads")
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"missing config keys: {', '.join(missing)}")
        return cls(**d).finalize()

    @classmethod
    def from_json(cls, path_or_text):
        """Accepts a path to a JSON file or the JSON text itself."""
        text = path_or_text
        if not path_or_text.lstrip().startswith("{"):
            with open(path_or_text) as f:
                text = f.read()
        return cls.from_dict(json.loads(text))

    def finalize(self):
        """Fill derived defaults and validate; returns self."""
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.d_ff is None:
            self.d_ff = default_d_ff(self.d_model, self.ffn)
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads",
                     "n_kv_heads", "d_ff"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name, allowed in (("norm", NORMS), ("norm_position", NORM_POSITIONS), ("ffn", FFNS),
                              ("position", POSITIONS), ("rope_pairing", ROPE_PAIRINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("tie_embeddings", "bias", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false")
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be divisible by n_heads")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be divisible by n_kv_heads")
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError("rope needs an even head_dim")
        if not self.norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("norm_eps and rope_theta must be > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")
        self.norm_eps = float(self.norm_eps)
        self.rope_theta = float(self.rope_theta)
        self.dropout = float(self.dropout)
        if self.sliding_window < 0 or self.sliding_window_pattern < 0:
            raise ValueError("sliding_window and sliding_window_pattern must be >= 0")
        for name in ("attn_softcap", "final_softcap", "embed_scale", "attn_scale"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
            setattr(self, name, float(getattr(self, name)))
        if self.post_norms and self.norm_position != "pre":
            raise ValueError("post_norms needs norm_position pre")
        if self.n_experts:
            if not 1 <= self.n_experts_used <= self.n_experts:
                raise ValueError("n_experts_used must be in [1, n_experts]")
            if self.ffn not in ("swiglu", "geglu") or self.bias:
                raise ValueError("experts need a gated ffn and no biases")
            if not self.expert_d_ff:
                self.expert_d_ff = self.d_ff
        self.router_aux_loss_coef = float(self.router_aux_loss_coef)
        self.router_z_loss_coef = float(self.router_z_loss_coef)
        return self

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


def tensor_schema(cfg):
    """Canonical (name, shape) list, in canonical order. The single source of truth here too."""
    d, hd, V = cfg.d_model, cfg.head_dim, cfg.vocab_size
    layernorm_bias = cfg.norm == "layernorm" and cfg.bias
    out = [("token_embd.weight", (V, d))]
    if cfg.position == "learned":
        out.append(("position_embd.weight", (cfg.context_length, d)))

    def linear(name, n_out, n_in, bias=cfg.bias):
        out.append((name + ".weight", (n_out, n_in)))
        if bias:
            out.append((name + ".bias", (n_out,)))

    def norm(name):
        out.append((name + ".weight", (d,)))
        if layernorm_bias:
            out.append((name + ".bias", (d,)))

    for l in range(cfg.n_layers):
        p = f"blk.{l}."
        norm(p + "attn_norm")
        qkv_bias = cfg.bias or cfg.qkv_bias
        linear(p + "attn_q", cfg.n_heads * hd, d, qkv_bias)
        linear(p + "attn_k", cfg.n_kv_heads * hd, d, qkv_bias)
        linear(p + "attn_v", cfg.n_kv_heads * hd, d, qkv_bias)
        linear(p + "attn_output", d, d)
        if cfg.post_norms:
            norm(p + "post_attention_norm")
        norm(p + "ffn_norm")
        if cfg.n_experts:
            E, Fe = cfg.n_experts, cfg.expert_d_ff
            out.append((p + "ffn_gate_inp.weight", (E, d)))
            out.append((p + "ffn_gate_exps.weight", (E, Fe, d)))
            out.append((p + "ffn_up_exps.weight", (E, Fe, d)))
            out.append((p + "ffn_down_exps.weight", (E, d, Fe)))
            if cfg.n_shared_experts:
                S = cfg.n_shared_experts * Fe
                out.append((p + "ffn_gate_shexp.weight", (S, d)))
                out.append((p + "ffn_up_shexp.weight", (S, d)))
                out.append((p + "ffn_down_shexp.weight", (d, S)))
                out.append((p + "ffn_gate_inp_shexp.weight", (d,)))
        else:
            if cfg.ffn in ("swiglu", "geglu"):
                linear(p + "ffn_gate", cfg.d_ff, d)
            linear(p + "ffn_up", cfg.d_ff, d)
            linear(p + "ffn_down", d, cfg.d_ff)
        if cfg.post_norms:
            norm(p + "post_ffw_norm")
    if cfg.norm_position == "pre":
        norm("output_norm")
    if not cfg.tie_embeddings:
        out.append(("output.weight", (V, d)))
    return out


# ----------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        # eps inside the sqrt, as in the C kernel.
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class LayerNorm(nn.Module):
    def __init__(self, d, eps, bias):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # biased variance
        y = (x - mean) / torch.sqrt(var + self.eps) * self.weight
        return y + self.bias if self.bias is not None else y


def make_norm(cfg):
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return LayerNorm(cfg.d_model, cfg.norm_eps, cfg.bias)


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def silu(x):
    return x * torch.sigmoid(x)


def rope_cos_sin(head_dim, theta, positions, factors=None):
    """cos/sin tables [T, head_dim/2] for the given absolute positions. Angles are computed in
    float64 (like the C side's table) and only the final cos/sin are cast to float32. factors
    (head_dim/2, or None) divide the frequencies: Llama 3.1's rope scaling."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * i / head_dim)
    if factors is not None:
        freq = freq / torch.as_tensor(factors, dtype=torch.float64)
    angle = positions.to(torch.float64)[:, None] * freq[None, :]
    return torch.cos(angle).float(), torch.sin(angle).float()


def apply_rope(x, cos, sin, pairing):
    """x: [B, T, heads, hd]; cos/sin: [T, hd/2]. Rotates each pair (a, b) by the angle."""
    cos = cos.to(x.dtype)[None, :, None, :]  # .to(): lets a float64 copy of the model run too
    sin = sin.to(x.dtype)[None, :, None, :]
    hd = x.shape[-1]
    if pairing == "half":
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]  # interleaved: (x[2i], x[2i+1])
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def sinusoidal_table(n_pos, d):
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same); float64 then float32."""
    p = torch.arange(n_pos, dtype=torch.float64)[:, None]
    j = torch.arange(d)
    pair = (j // 2).to(torch.float64)  # i for both columns 2i and 2i+1
    angle = p / (10000.0 ** (2.0 * pair / d))[None, :]
    pe = torch.where(j[None, :] % 2 == 0, torch.sin(angle), torch.cos(angle))
    return pe.float()


class Attention(nn.Module):
    def __init__(self, cfg, layer=0):
        super().__init__()
        self.cfg = cfg
        pattern = cfg.sliding_window_pattern
        self.window = cfg.sliding_window if pattern == 0 or (layer + 1) % pattern else 0
        hd = cfg.head_dim
        qkv_bias = cfg.bias or cfg.qkv_bias
        self.q = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=qkv_bias)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=qkv_bias)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=qkv_bias)
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x, cos, sin, cache=None, rec=None):
        """x: [B, T, d]. cache: None, or a dict this layer keeps its post-RoPE k and v in
        ({"k": [B, S, KVH, hd], "v": ...}); new keys are appended so the next call attends to
        them (the KV-cache path used by incremental-decoding tests)."""
        cfg = self.cfg
        B, T, _ = x.shape
        H, KVH, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q = self.q(x).view(B, T, H, hd)
        k = self.k(x).view(B, T, KVH, hd)
        v = self.v(x).view(B, T, KVH, hd)
        if cos is not None:
            q = apply_rope(q, cos, sin, cfg.rope_pairing)
            k = apply_rope(k, cos, sin, cfg.rope_pairing)
        past = 0
        if cache is not None:
            if "k" in cache:
                past = cache["k"].shape[1]
                k = torch.cat([cache["k"], k], dim=1)
                v = torch.cat([cache["v"], v], dim=1)
            cache["k"], cache["v"] = k, v
        S = k.shape[1]
        # Query head h reads kv head h // group: repeat each kv head `group` times in a row.
        group = H // KVH
        k_rep = k.repeat_interleave(group, dim=2)
        v_rep = v.repeat_interleave(group, dim=2)
        # [B, heads, T, hd] for batched matmul over (batch, head).
        qh, kh, vh = q.transpose(1, 2), k_rep.transpose(1, 2), v_rep.transpose(1, 2)
        if cfg.attn_scale:  # Gemma 2: query_pre_attn_scalar ** -0.5
            scores = (qh @ kh.transpose(-1, -2)) * cfg.attn_scale  # [B, H, T, S]
        else:
            scores = qh @ kh.transpose(-1, -2) / math.sqrt(hd)
        if cfg.attn_softcap:  # Gemma 2's attn_logit_softcapping, before the mask
            scores = torch.tanh(scores / cfg.attn_softcap) * cfg.attn_softcap
        # Query t (at cache index past + t) sees keys 0 .. past + t.
        qi = torch.arange(T)[:, None] + past
        kj = torch.arange(S)[None, :]
        scores = scores.masked_fill(kj > qi, float("-inf"))
        if self.window:  # and the keys more than window - 1 positions back
            scores = scores.masked_fill(kj <= qi - self.window, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = F.dropout(probs, cfg.dropout, self.training)
        out = (probs @ vh).transpose(1, 2).reshape(B, T, H * hd)  # concat heads
        out = self.o(out)
        if rec is not None:
            rec.update(q=q, k=k, v=v, attn_probs=probs, attn_heads=out)
        return out


class FFN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.kind = cfg.ffn
        gated = cfg.ffn in ("swiglu", "geglu")
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if gated else None
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x, rec=None):
        if self.kind == "swiglu":
            h = silu(self.gate(x)) * self.up(x)
        elif self.kind == "geglu":  # Gemma: gelu_pytorch_tanh(gate) * up
            h = gelu_tanh(self.gate(x)) * self.up(x)
        elif self.kind == "gelu":
            h = gelu_erf(self.up(x))
        elif self.kind == "gelu_tanh":
            h = gelu_tanh(self.up(x))
        else:
            h = torch.relu(self.up(x))
        if rec is not None:
            rec["ffn_hidden"] = h
        return self.down(h)


def route(probs, k):
    """The k most probable experts of each row, a tie going to the lower index (a stable sort),
    and their probabilities (through which the gradient flows)."""
    sel = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    return probs.gather(1, sel), sel


class MoE(nn.Module):
    """A sparse mixture-of-experts FFN: each expert computes only the rows routed to it."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        E, Fe, d = cfg.n_experts, cfg.expert_d_ff, cfg.d_model
        self.router = nn.Parameter(torch.empty(E, d))
        self.gate_exps = nn.Parameter(torch.empty(E, Fe, d))
        self.up_exps = nn.Parameter(torch.empty(E, Fe, d))
        self.down_exps = nn.Parameter(torch.empty(E, d, Fe))
        self.gate_sh = self.up_sh = self.down_sh = self.sh_gate = None
        if cfg.n_shared_experts:
            S = cfg.n_shared_experts * Fe
            self.gate_sh = nn.Parameter(torch.empty(S, d))
            self.up_sh = nn.Parameter(torch.empty(S, d))
            self.down_sh = nn.Parameter(torch.empty(d, S))
            self.sh_gate = nn.Parameter(torch.empty(d))
        self.router_logits = None  # of the last forward, for the router losses

    def act(self, g):
        return gelu_tanh(g) if self.cfg.ffn == "geglu" else silu(g)

    def forward(self, x, rec=None):
        cfg = self.cfg
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        logits = x2 @ self.router.t()
        self.router_logits = logits
        probs = torch.softmax(logits, dim=-1)
        w, sel = route(probs, cfg.n_experts_used)
        if cfg.expert_weights_norm:
            w = w / w.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x2)
        for e in range(cfg.n_experts):
            rows, slot = (sel == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = x2[rows]
            h = self.act(xe @ self.gate_exps[e].t()) * (xe @ self.up_exps[e].t())
            out = out.index_add(0, rows, (h @ self.down_exps[e].t()) * w[rows, slot][:, None])
        if self.gate_sh is not None:
            h = self.act(x2 @ self.gate_sh.t()) * (x2 @ self.up_sh.t())
            out = out + torch.sigmoid(x2 @ self.sh_gate)[:, None] * (h @ self.down_sh.t())
        if rec is not None:
            rec["router_probs"] = probs
        return out.reshape(shape)


def router_losses(logits_per_layer, cfg):
    """Hugging Face's load_balancing_loss_func (Mixtral, OLMoE, Qwen2-MoE) over every layer's
    router logits concatenated: n_experts * sum over experts of (the fraction of rows that chose
    it, summed over the k choices) * (its mean probability); and Switch Transformer's z-loss,
    the mean of logsumexp(logits)^2 over the same rows."""
    logits = torch.cat(logits_per_layer, dim=0)
    probs = torch.softmax(logits, dim=-1)
    _, sel = route(probs, cfg.n_experts_used)
    mask = F.one_hot(sel, cfg.n_experts).float()  # [rows, k, E]
    tokens_per_expert = mask.mean(dim=0)
    prob_per_expert = probs.mean(dim=0)
    aux = (tokens_per_expert * prob_per_expert[None, :]).sum() * cfg.n_experts
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    return aux, z


class Block(nn.Module):
    def __init__(self, cfg, layer=0):
        super().__init__()
        self.cfg = cfg
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = make_norm(cfg)
        self.ffn = MoE(cfg) if cfg.n_experts else FFN(cfg)
        # Gemma 2's post_attention_layernorm and post_feedforward_layernorm
        self.post_attn_norm = make_norm(cfg) if cfg.post_norms else None
        self.post_ffn_norm = make_norm(cfg) if cfg.post_norms else None

    def forward(self, x, cos, sin, cache=None, rec=None):
        p, train = self.cfg.dropout, self.training
        if self.cfg.post_norms:  # pre-norm with a norm on each sub-layer's output too
            a = self.attn(self.attn_norm(x), cos, sin, cache, rec)
            a = F.dropout(self.post_attn_norm(a), p, train)
            x = x + a
            if rec is not None:
                rec["attn_out"], rec["resid_attn"] = a, x
            f = F.dropout(self.post_ffn_norm(self.ffn(self.ffn_norm(x), rec)), p, train)
            x = x + f
        elif self.cfg.norm_position == "pre":
            a = F.dropout(self.attn(self.attn_norm(x), cos, sin, cache, rec), p, train)
            x = x + a
            if rec is not None:
                rec["attn_out"], rec["resid_attn"] = a, x
            f = F.dropout(self.ffn(self.ffn_norm(x), rec), p, train)
            x = x + f
        else:  # post-norm: normalise after each residual add
            a = F.dropout(self.attn(x, cos, sin, cache, rec), p, train)
            x = self.attn_norm(x + a)
            if rec is not None:
                rec["attn_out"], rec["resid_attn"] = a, x
            f = F.dropout(self.ffn(x, rec), p, train)
            x = self.ffn_norm(x + f)
        if rec is not None:
            rec["ffn_out"], rec["out"] = f, x
        return x


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = Config.from_dict(cfg)
        self.cfg = cfg
        self.rope_factors = None  # Llama 3.1's RoPE scaling, set by a caller that has it
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = (nn.Embedding(cfg.context_length, cfg.d_model)
                        if cfg.position == "learned" else None)
        if cfg.position == "sinusoidal":
            # Fixed table, not a parameter (and not in the canonical state dict).
            self.register_buffer("pe", sinusoidal_table(cfg.context_length, cfg.d_model),
                                 persistent=False)
        self.blocks = nn.ModuleList([Block(cfg, l) for l in range(cfg.n_layers)])
        self.output_norm = make_norm(cfg) if cfg.norm_position == "pre" else None
        self.output = (None if cfg.tie_embeddings
                       else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False))
        # Set `record = True` to keep every intermediate of the last forward in `self.acts`
        # (names like "embed", "blk.0.q", "blk.0.attn_probs", "blk.1.out", "final_norm").
        self.record = False
        self.acts = {}
        self.init_weights()

    def init_weights(self, std=0.02, generator=None):
        """Simple GPT-2-like init (the C side has its own; parity tests load explicit weights)."""
        for name, p in self.canonical_params():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, std, generator=generator)

    # --- canonical names ---------------------------------------------------------------------

    def canonical_params(self):
        """(canonical name, Parameter) in canonical order."""
        out = [("token_embd.weight", self.tok_emb.weight)]
        if self.pos_emb is not None:
            out.append(("position_embd.weight", self.pos_emb.weight))

        def add(name, module):
            out.append((name + ".weight", module.weight))
            if getattr(module, "bias", None) is not None:
                out.append((name + ".bias", module.bias))

        for l, blk in enumerate(self.blocks):
            p = f"blk.{l}."
            add(p + "attn_norm", blk.attn_norm)
            add(p + "attn_q", blk.attn.q)
            add(p + "attn_k", blk.attn.k)
            add(p + "attn_v", blk.attn.v)
            add(p + "attn_output", blk.attn.o)
            if blk.post_attn_norm is not None:
                add(p + "post_attention_norm", blk.post_attn_norm)
            add(p + "ffn_norm", blk.ffn_norm)
            if isinstance(blk.ffn, MoE):
                f = blk.ffn
                out += [(p + "ffn_gate_inp.weight", f.router),
                        (p + "ffn_gate_exps.weight", f.gate_exps),
                        (p + "ffn_up_exps.weight", f.up_exps),
                        (p + "ffn_down_exps.weight", f.down_exps)]
                if f.gate_sh is not None:
                    out += [(p + "ffn_gate_shexp.weight", f.gate_sh),
                            (p + "ffn_up_shexp.weight", f.up_sh),
                            (p + "ffn_down_shexp.weight", f.down_sh),
                            (p + "ffn_gate_inp_shexp.weight", f.sh_gate)]
            else:
                if blk.ffn.gate is not None:
                    add(p + "ffn_gate", blk.ffn.gate)
                add(p + "ffn_up", blk.ffn.up)
                add(p + "ffn_down", blk.ffn.down)
            if blk.post_ffn_norm is not None:
                add(p + "post_ffw_norm", blk.post_ffn_norm)
        if self.output_norm is not None:
            add("output_norm", self.output_norm)
        if self.output is not None:
            add("output", self.output)
        # Guard: the module tree and the schema must agree on names, order and shapes.
        got = [(n, tuple(t.shape)) for n, t in out]
        assert got == tensor_schema(self.cfg), "canonical_params disagrees with tensor_schema"
        return out

    def canonical_grads(self):
        """OrderedDict canonical name -> gradient (None where no gradient was computed)."""
        return OrderedDict((n, None if p.grad is None else p.grad.detach().clone())
                           for n, p in self.canonical_params())

    def state_dict_canonical(self):
        return OrderedDict((n, p.detach().clone()) for n, p in self.canonical_params())

    def load_canonical(self, tensors):
        """Load from {canonical name: tensor or numpy array}. Names and shapes must match exactly."""
        params = self.canonical_params()
        expected = {n for n, _ in params}
        missing, extra = expected - set(tensors), set(tensors) - expected
        if missing or extra:
            raise KeyError(f"missing {sorted(missing)}, unexpected {sorted(extra)}")
        with torch.no_grad():
            for name, p in params:
                t = torch.as_tensor(tensors[name])
                if tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"{name}: shape {tuple(t.shape)} != {tuple(p.shape)}")
                p.copy_(t.to(p.dtype))

    # --- forward -----------------------------------------------------------------------------

    def forward(self, ids, pos_offset=0, targets=None, cache=None):
        """ids: [B, T] int. Tokens sit at absolute positions pos_offset .. pos_offset+T-1.
        cache: optional list with one dict per layer (start with [{} for each layer]); keys and
        values are appended so a later call with pos_offset = tokens so far continues the sequence.
        Returns (logits [B, T, V], loss or None)."""
        cfg = self.cfg
        B, T = ids.shape
        if pos_offset < 0 or pos_offset + T > cfg.context_length:
            raise ValueError(f"positions {pos_offset}..{pos_offset + T - 1} exceed context_length")
        rec = {} if self.record else None
        positions = torch.arange(pos_offset, pos_offset + T)

        x = self.tok_emb(ids)
        if cfg.embed_scale:  # Gemma's normalizer, sqrt(d_model): the table itself stays unscaled
            x = x * cfg.embed_scale
        if cfg.position == "learned":
            x = x + self.pos_emb(positions)[None]
        elif cfg.position == "sinusoidal":
            x = x + self.pe[positions][None]
        x = F.dropout(x, cfg.dropout, self.training)
        if rec is not None:
            rec["embed"] = x

        cos = sin = None
        if cfg.position == "rope":
            cos, sin = rope_cos_sin(cfg.head_dim, cfg.rope_theta, positions, self.rope_factors)

        for l, blk in enumerate(self.blocks):
            r = {} if rec is not None else None
            x = blk(x, cos, sin, None if cache is None else cache[l], r)
            if rec is not None:
                rec.update({f"blk.{l}.{k}": v for k, v in r.items()})

        if self.output_norm is not None:
            x = self.output_norm(x)
        if rec is not None:
            rec["final_norm"] = x
        if cfg.tie_embeddings:
            logits = x @ self.tok_emb.weight.t()  # LM head never has a bias
        else:
            logits = self.output(x)  # a module, so that an adapter may wrap it (gen_lora.py)
        if cfg.final_softcap:  # Gemma 2's final_logit_softcapping
            logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap
        if rec is not None:
            rec["logits"] = logits
            self.acts = rec

        # A mixture of experts' router losses over this forward's layers (without their
        # coefficients); training adds router_aux_loss_coef * aux + router_z_loss_coef * z.
        self.router_aux = self.router_z = None
        if cfg.n_experts:
            self.router_aux, self.router_z = router_losses(
                [blk.ffn.router_logits for blk in self.blocks], cfg)

        loss = None
        if targets is not None:
            loss = cross_entropy(logits, targets)
        return logits, loss

    def train_loss(self, loss):
        """The training loss of the last forward: its cross-entropy plus the router losses."""
        cfg = self.cfg
        if not cfg.n_experts:
            return loss
        return (loss + cfg.router_aux_loss_coef * self.router_aux
                + cfg.router_z_loss_coef * self.router_z)


def cross_entropy(logits, targets):
    """Mean over positions with target >= 0 (negatives are ignored). With no valid position the
    loss is 0 (a sum over nothing divided by max(count, 1)) rather than NaN."""
    V = logits.shape[-1]
    logits = logits.reshape(-1, V)
    targets = targets.reshape(-1).long()
    valid = targets >= 0
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    picked = logp.gather(1, targets.clamp(min=0)[:, None])[:, 0]
    nll = -(picked * valid.to(logp.dtype)).sum()
    return nll / valid.sum().clamp(min=1).to(logp.dtype)
