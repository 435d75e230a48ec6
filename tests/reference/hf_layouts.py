"""Hugging Face checkpoint layouts for the format tests, written from the reference model.

    hf_layouts.py write OUTDIR      random models as HF directories + expected logits
    hf_layouts.py check HFDIR FILE  loads an HF directory (tlm's export) into the reference and
                                    compares its logits with FILE's (ids + tlm's logits)
    hf_layouts.py check HFDIR FILE PEFTDIR
                                    the same with a PEFT LoRA directory (tlm's) applied as PEFT
                                    does: each adapted HF weight W gives W x + s B (A x)

Layouts follow transformers' LlamaForCausalLM, MistralForCausalLM, Gemma2ForCausalLM and
GPT2LMHeadModel state dicts:
- Llama: the reference model rotates adjacent pairs (Meta's order); HF rotates halves and its
  converter permutes the q/k rows to match, so we apply the same permutation when writing. tlm must
  undo that (or use half pairing) to reproduce the reference's logits.
- Mistral: Llama's names with sliding_window, a window on every layer.
- Gemma 2: four norms a layer (input, post_attention, pre_feedforward, post_feedforward), each
  stored as w for a norm that scales by 1 + w (the reference's norms scale by their weight: w + 1);
  the embedding scaled by sqrt(hidden_size) in the model's code; scores scaled by
  query_pre_attn_scalar ** -0.5 and soft-capped, logits soft-capped; layer_types says which
  layers attend through sliding_window; q/k rows in halves as HF trains them.
- GPT-2: Conv1D weights are [in, out], q/k/v fused in c_attn, `transformer.` prefix optional,
  causal-mask buffers attn.bias / attn.masked_bias sit in old checkpoints and must be ignored.
Run with /usr/bin/python3 (Debian's torch).
"""

import json
import math
import os
import sys

import numpy as np
import torch

# Importing the modules beside this file leaves no __pycache__ in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Model  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.canonical_params():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name in ("token_embd.weight", "position_embd.weight"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def meta_to_hf(w, n_heads):
    """transformers' convert_llama_weights_to_hf permute: adjacent pairs -> halves, per head."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def llama3_factors(cfg, scaling):
    """transformers' _compute_llama3_parameters: the scaled inverse frequencies, as the factors
    that divide the plain ones (written here from its formula, apart from tlm's C code)."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64)
                                         / cfg.head_dim))
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / lo, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / hi) & (wavelen <= old / lo)
    scaled = torch.where(medium, smoothed, scaled)
    return inv_freq / scaled


def round_to(t, dtype):
    return t.to(dtype).to(torch.float32)


def llama_tensors(model, cfg, dtype, arch="llama"):
    sd = model.state_dict_canonical()
    out = [("model.embed_tokens.weight", sd["token_embd.weight"])]
    for l in range(cfg.n_layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        out += [
            (p + "input_layernorm.weight", sd[b + "attn_norm.weight"]),
            (p + "self_attn.q_proj.weight", meta_to_hf(sd[b + "attn_q.weight"], cfg.n_heads)),
            (p + "self_attn.k_proj.weight", meta_to_hf(sd[b + "attn_k.weight"], cfg.n_kv_heads)),
            (p + "self_attn.v_proj.weight", sd[b + "attn_v.weight"]),
        ]
        if cfg.qkv_bias:  # Qwen2: q, k and v biases, permuted with their rows
            out += [
                (p + "self_attn.q_proj.bias",
                 meta_to_hf(sd[b + "attn_q.bias"][:, None], cfg.n_heads)[:, 0]),
                (p + "self_attn.k_proj.bias",
                 meta_to_hf(sd[b + "attn_k.bias"][:, None], cfg.n_kv_heads)[:, 0]),
                (p + "self_attn.v_proj.bias", sd[b + "attn_v.bias"]),
            ]
        out += [
            (p + "self_attn.o_proj.weight", sd[b + "attn_output.weight"]),
            (p + "post_attention_layernorm.weight", sd[b + "ffn_norm.weight"]),
            (p + "mlp.gate_proj.weight", sd[b + "ffn_gate.weight"]),
            (p + "mlp.up_proj.weight", sd[b + "ffn_up.weight"]),
            (p + "mlp.down_proj.weight", sd[b + "ffn_down.weight"]),
        ]
    out.append(("model.norm.weight", sd["output_norm.weight"]))
    if not cfg.tie_embeddings:
        out.append(("lm_head.weight", sd["output.weight"]))
    config = {
        "architectures": [{"qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}.get(
            arch, "LlamaForCausalLM")],
        "model_type": arch,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.context_length, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "hidden_act": "silu", "rope_scaling": None,
        "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": str(dtype).split(".")[1],
    }
    if arch == "mistral":
        config["sliding_window"] = cfg.sliding_window
    if arch == "qwen2":
        config.update({"use_sliding_window": False, "sliding_window": 4096,
                       "max_window_layers": cfg.n_layers})
    return [(n, t.contiguous().to(dtype)) for n, t in out], config


def gemma2_tensors(model, cfg, dtype):
    sd = model.state_dict_canonical()
    out = [("model.embed_tokens.weight", sd["token_embd.weight"])]
    for l in range(cfg.n_layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        out += [
            (p + "input_layernorm.weight", sd[b + "attn_norm.weight"] - 1),
            (p + "self_attn.q_proj.weight", sd[b + "attn_q.weight"]),
            (p + "self_attn.k_proj.weight", sd[b + "attn_k.weight"]),
            (p + "self_attn.v_proj.weight", sd[b + "attn_v.weight"]),
            (p + "self_attn.o_proj.weight", sd[b + "attn_output.weight"]),
            (p + "post_attention_layernorm.weight", sd[b + "post_attention_norm.weight"] - 1),
            (p + "pre_feedforward_layernorm.weight", sd[b + "ffn_norm.weight"] - 1),
            (p + "mlp.gate_proj.weight", sd[b + "ffn_gate.weight"]),
            (p + "mlp.up_proj.weight", sd[b + "ffn_up.weight"]),
            (p + "mlp.down_proj.weight", sd[b + "ffn_down.weight"]),
            (p + "post_feedforward_layernorm.weight", sd[b + "post_ffw_norm.weight"] - 1),
        ]
    out.append(("model.norm.weight", sd["output_norm.weight"] - 1))
    P = cfg.sliding_window_pattern
    config = {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_length,
        "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": round(cfg.attn_scale ** -2),
        "attn_logit_softcapping": cfg.attn_softcap or None,
        "final_logit_softcapping": cfg.final_softcap or None,
        "sliding_window": cfg.sliding_window,
        "layer_types": ["full_attention" if P and (l + 1) % P == 0 else "sliding_attention"
                        for l in range(cfg.n_layers)],
        "attention_bias": False, "tie_word_embeddings": True,
        "torch_dtype": str(dtype).split(".")[1],
    }
    return [(n, t.contiguous().to(dtype)) for n, t in out], config


def gpt2_tensors(model, cfg, dtype, prefix, buffers):
    sd = model.state_dict_canonical()
    P = prefix
    out = [(P + "wte.weight", sd["token_embd.weight"]), (P + "wpe.weight", sd["position_embd.weight"])]
    for l in range(cfg.n_layers):
        p, b = f"{P}h.{l}.", f"blk.{l}."
        qkv_w = torch.cat([sd[b + "attn_q.weight"], sd[b + "attn_k.weight"], sd[b + "attn_v.weight"]])
        qkv_b = torch.cat([sd[b + "attn_q.bias"], sd[b + "attn_k.bias"], sd[b + "attn_v.bias"]])
        out += [
            (p + "ln_1.weight", sd[b + "attn_norm.weight"]), (p + "ln_1.bias", sd[b + "attn_norm.bias"]),
            (p + "attn.c_attn.weight", qkv_w.t()), (p + "attn.c_attn.bias", qkv_b),
            (p + "attn.c_proj.weight", sd[b + "attn_output.weight"].t()),
            (p + "attn.c_proj.bias", sd[b + "attn_output.bias"]),
            (p + "ln_2.weight", sd[b + "ffn_norm.weight"]), (p + "ln_2.bias", sd[b + "ffn_norm.bias"]),
            (p + "mlp.c_fc.weight", sd[b + "ffn_up.weight"].t()), (p + "mlp.c_fc.bias", sd[b + "ffn_up.bias"]),
            (p + "mlp.c_proj.weight", sd[b + "ffn_down.weight"].t()),
            (p + "mlp.c_proj.bias", sd[b + "ffn_down.bias"]),
        ]
        if buffers:
            n = cfg.context_length
            out.append((p + "attn.bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n)))
            out.append((p + "attn.masked_bias", torch.tensor(-1e4)))
    out += [(P + "ln_f.weight", sd["output_norm.weight"]), (P + "ln_f.bias", sd["output_norm.bias"])]
    if not cfg.tie_embeddings:
        out.append(("lm_head.weight", sd["output.weight"]))
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_positions": cfg.context_length,
        "n_ctx": cfg.context_length, "vocab_size": cfg.vocab_size, "n_inner": None,
        "layer_norm_epsilon": cfg.norm_eps, "activation_function": "gelu_new",
        "tie_word_embeddings": cfg.tie_embeddings,
    }
    return [(n, t.contiguous().to(dtype)) for n, t in out], config


CASES = [
    # name, arch, config, dtype, shards, extra
    ("llama_tied", "llama", dict(vocab_size=64, context_length=32, d_model=32, n_layers=2,
                                 n_heads=4, n_kv_heads=2, d_ff=48, tie_embeddings=True), torch.float32, 1, {}),
    ("llama_sharded", "llama", dict(vocab_size=80, context_length=24, d_model=48, n_layers=3,
                                    n_heads=6, n_kv_heads=3, d_ff=64, tie_embeddings=False,
                                    norm_eps=1e-6, rope_theta=500000.0), torch.bfloat16, 3, {}),
    ("llama31_scaled", "llama", dict(vocab_size=64, context_length=48, d_model=64, n_layers=2,
                                     n_heads=4, n_kv_heads=2, d_ff=64, tie_embeddings=True,
                                     rope_theta=500000.0),
     torch.float32, 1, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64}}),
    ("qwen2_tied", "qwen2", dict(vocab_size=72, context_length=24, d_model=32, n_layers=2,
                                 n_heads=4, n_kv_heads=2, d_ff=40, tie_embeddings=True,
                                 qkv_bias=True, norm_eps=1e-6, rope_theta=1000000.0),
     torch.float32, 1, {}),
    # windows shorter than the context, so that they change the logits
    ("mistral_window", "mistral", dict(vocab_size=64, context_length=32, d_model=32, n_layers=2,
                                       n_heads=4, n_kv_heads=2, d_ff=48, tie_embeddings=False,
                                       sliding_window=5), torch.float32, 1, {}),
    ("gemma2_window", "gemma2", dict(vocab_size=64, context_length=32, d_model=32, n_layers=4,
                                     n_heads=4, n_kv_heads=2, d_ff=48, tie_embeddings=True,
                                     norm_eps=1e-6, sliding_window=6, sliding_window_pattern=2,
                                     attn_softcap=1.5, final_softcap=2.0, attn_scale=8 ** -0.5,
                                     embed_scale=32 ** 0.5, post_norms=True, ffn="geglu",
                                     rope_pairing="half"), torch.float32, 1, {}),
    ("gpt2_prefix", "gpt2", dict(vocab_size=70, context_length=20, d_model=32, n_layers=2,
                                 n_heads=4, tie_embeddings=True), torch.float32, 1,
     {"prefix": "transformer.", "buffers": True}),
    ("gpt2_untied_f16", "gpt2", dict(vocab_size=50, context_length=16, d_model=24, n_layers=2,
                                     n_heads=3, tie_embeddings=False), torch.float16, 2,
     {"prefix": "", "buffers": False}),
]


def write_dir(path, tensors, config, shards):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
        return
    per = (len(tensors) + shards - 1) // shards
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = tensors[s * per:(s + 1) * per]
        write_safetensors(os.path.join(path, name), part, {"format": "pt"})
        weight_map.update({n: name for n, _ in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=1)


def cmd_write(outdir):
    os.makedirs(outdir, exist_ok=True)
    for i, (name, arch, c, dtype, shards, extra) in enumerate(CASES):
        gen = torch.Generator().manual_seed(4242 + i)
        if arch in ("llama", "qwen2", "mistral"):
            cfg = Config.from_dict(dict(c, rope_pairing="interleaved"))
        elif arch == "gemma2":
            cfg = Config.from_dict(c)
        else:
            cfg = Config.from_dict(dict(c, norm="layernorm", ffn="gelu_tanh", position="learned",
                                        bias=True))
        model = Model(cfg)
        if "rope_scaling" in extra:
            model.rope_factors = llama3_factors(cfg, extra["rope_scaling"])
        randomize(model, gen)
        with torch.no_grad():  # the logits are those of the weights as stored
            for _, p in model.canonical_params():
                p.copy_(round_to(p, dtype))
        model.eval()
        if arch == "gemma2":
            tensors, config = gemma2_tensors(model, cfg, dtype)
        elif arch in ("llama", "qwen2", "mistral"):
            tensors, config = llama_tensors(model, cfg, dtype, arch)
            if "rope_scaling" in extra:
                config["rope_scaling"] = extra["rope_scaling"]
        else:
            tensors, config = gpt2_tensors(model, cfg, dtype, extra["prefix"], extra["buffers"])
        write_dir(os.path.join(outdir, name), tensors, config, shards)
        ids = torch.randint(0, cfg.vocab_size, (1, cfg.context_length), generator=gen)
        with torch.no_grad():
            logits, _ = model(ids)
        write_safetensors(os.path.join(outdir, name + ".expected.safetensors"),
                          {"ids": ids[0].to(torch.int32).numpy(),
                           "logits": logits[0].numpy().astype(np.float32)})
    print(f"wrote {len(CASES)} Hugging Face layouts to {outdir}")


def apply_peft(t, peftdir):
    """Adds s * B @ A of every matrix of a PEFT LoRA directory to the HF weights it names
    (base_model.model.<module>.lora_A.weight adapts <module>.weight), in place."""
    with open(os.path.join(peftdir, "adapter_config.json")) as f:
        pc = json.load(f)
    r, alpha = pc["r"], pc["lora_alpha"]
    s = alpha / math.sqrt(r) if pc.get("use_rslora") else alpha / r
    ad, _ = read_safetensors(os.path.join(peftdir, "adapter_model.safetensors"))
    n = 0
    for k, a in ad.items():
        if not k.endswith(".lora_A.weight"):
            continue
        mod = k[len("base_model.model."):-len(".lora_A.weight")]
        b = ad[k.replace(".lora_A.", ".lora_B.")]
        A = torch.from_numpy(np.asarray(a, dtype=np.float32))
        B = torch.from_numpy(np.asarray(b, dtype=np.float32))
        t[mod + ".weight"] = t[mod + ".weight"] + s * (B.double() @ A.double()).float()
        n += 1
    return n


def hf_to_canonical(path, peftdir=None):
    """Inverse mapping of an HF directory into (Config, canonical tensors) for the reference."""
    with open(os.path.join(path, "config.json")) as f:
        hc = json.load(f)
    tensors, _ = read_safetensors(os.path.join(path, "model.safetensors"))
    t = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in tensors.items()}
    if peftdir:
        print(f"{peftdir}: {apply_peft(t, peftdir)} LoRA matrices applied")
    arch = hc["architectures"][0]
    sd = {}
    if arch == "Gemma2ForCausalLM":
        # Gemma2's modeling: norms scale by 1 + w, embeddings by sqrt(hidden_size), scores by
        # query_pre_attn_scalar ** -0.5; layer_types names the windowed layers
        types = hc["layer_types"]
        windowed = [x == "sliding_attention" for x in types]
        full = [i for i, w in enumerate(windowed) if not w]
        pattern = full[0] + 1 if full and any(windowed) else 0
        assert all(windowed[l] == (pattern == 0 or (l + 1) % pattern != 0)
                   for l in range(len(types))), types
        cfg = Config.from_dict(dict(
            vocab_size=hc["vocab_size"], context_length=hc["max_position_embeddings"],
            d_model=hc["hidden_size"], n_layers=hc["num_hidden_layers"],
            n_heads=hc["num_attention_heads"], n_kv_heads=hc["num_key_value_heads"],
            d_ff=hc["intermediate_size"], norm_eps=hc["rms_norm_eps"], rope_theta=hc["rope_theta"],
            rope_pairing="half", tie_embeddings=True, ffn="geglu", post_norms=True,
            embed_scale=hc["hidden_size"] ** 0.5, attn_scale=hc["query_pre_attn_scalar"] ** -0.5,
            attn_softcap=hc["attn_logit_softcapping"] or 0.0,
            final_softcap=hc["final_logit_softcapping"] or 0.0,
            sliding_window=hc["sliding_window"] if any(windowed) else 0,
            sliding_window_pattern=pattern))
        assert hc["hidden_activation"] == "gelu_pytorch_tanh" and hc["head_dim"] == cfg.head_dim
        sd["token_embd.weight"] = t["model.embed_tokens.weight"]
        names = [("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"),
                 ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                 ("self_attn.o_proj", "attn_output"),
                 ("post_attention_layernorm", "post_attention_norm"),
                 ("pre_feedforward_layernorm", "ffn_norm"), ("mlp.gate_proj", "ffn_gate"),
                 ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
                 ("post_feedforward_layernorm", "post_ffw_norm")]
        for l in range(cfg.n_layers):
            for h, c in names:
                w = t[f"model.layers.{l}.{h}.weight"]
                sd[f"blk.{l}.{c}.weight"] = w + 1 if h.endswith("layernorm") else w
        sd["output_norm.weight"] = t["model.norm.weight"] + 1
    elif arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"):
        qwen2 = arch == "Qwen2ForCausalLM"
        cfg = Config.from_dict(dict(
            vocab_size=hc["vocab_size"], context_length=hc["max_position_embeddings"],
            d_model=hc["hidden_size"], n_layers=hc["num_hidden_layers"],
            n_heads=hc["num_attention_heads"], n_kv_heads=hc["num_key_value_heads"],
            d_ff=hc["intermediate_size"], norm_eps=hc["rms_norm_eps"], rope_theta=hc["rope_theta"],
            rope_pairing="half", tie_embeddings=hc["tie_word_embeddings"], qkv_bias=qwen2,
            sliding_window=(hc.get("sliding_window") or 0) if arch == "MistralForCausalLM" else 0))
        sd["token_embd.weight"] = t["model.embed_tokens.weight"]
        names = [("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"),
                 ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                 ("self_attn.o_proj", "attn_output"), ("post_attention_layernorm", "ffn_norm"),
                 ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")]
        for l in range(cfg.n_layers):
            for h, c in names:
                sd[f"blk.{l}.{c}.weight"] = t[f"model.layers.{l}.{h}.weight"]
            for h, c in names[1:4] if qwen2 else ():
                sd[f"blk.{l}.{c}.bias"] = t[f"model.layers.{l}.{h}.bias"]
        sd["output_norm.weight"] = t["model.norm.weight"]
        if not cfg.tie_embeddings:
            sd["output.weight"] = t["lm_head.weight"]
    elif arch == "GPT2LMHeadModel":
        P = "transformer." if "transformer.wte.weight" in t else ""
        d = hc["n_embd"]
        cfg = Config.from_dict(dict(
            vocab_size=hc["vocab_size"], context_length=hc["n_positions"], d_model=d,
            n_layers=hc["n_layer"], n_heads=hc["n_head"], d_ff=hc.get("n_inner") or 4 * d,
            norm="layernorm", norm_eps=hc["layer_norm_epsilon"], ffn="gelu_tanh",
            position="learned", bias=True, tie_embeddings=hc.get("tie_word_embeddings", True)))
        sd["token_embd.weight"] = t[P + "wte.weight"]
        sd["position_embd.weight"] = t[P + "wpe.weight"]
        for l in range(cfg.n_layers):
            p, b = f"{P}h.{l}.", f"blk.{l}."
            w, bias = t[p + "attn.c_attn.weight"].t(), t[p + "attn.c_attn.bias"]
            for i, c in enumerate(("attn_q", "attn_k", "attn_v")):
                sd[b + c + ".weight"] = w[i * d:(i + 1) * d]
                sd[b + c + ".bias"] = bias[i * d:(i + 1) * d]
            sd[b + "attn_output.weight"] = t[p + "attn.c_proj.weight"].t()
            sd[b + "attn_output.bias"] = t[p + "attn.c_proj.bias"]
            sd[b + "attn_norm.weight"], sd[b + "attn_norm.bias"] = t[p + "ln_1.weight"], t[p + "ln_1.bias"]
            sd[b + "ffn_norm.weight"], sd[b + "ffn_norm.bias"] = t[p + "ln_2.weight"], t[p + "ln_2.bias"]
            sd[b + "ffn_up.weight"] = t[p + "mlp.c_fc.weight"].t()
            sd[b + "ffn_up.bias"] = t[p + "mlp.c_fc.bias"]
            sd[b + "ffn_down.weight"] = t[p + "mlp.c_proj.weight"].t()
            sd[b + "ffn_down.bias"] = t[p + "mlp.c_proj.bias"]
        sd["output_norm.weight"], sd["output_norm.bias"] = t[P + "ln_f.weight"], t[P + "ln_f.bias"]
        if not cfg.tie_embeddings:
            sd["output.weight"] = t["lm_head.weight"]
    else:
        raise ValueError(f"unknown architecture {arch}")
    return cfg, {k: v.contiguous() for k, v in sd.items()}


def cmd_check(hfdir, expected, peftdir=None):
    cfg, sd = hf_to_canonical(hfdir, peftdir)
    model = Model(cfg)
    model.load_canonical(sd)
    model.eval()
    exp, _ = read_safetensors(expected)
    ids = torch.from_numpy(exp["ids"].astype(np.int64))[None]
    with torch.no_grad():
        logits, _ = model(ids)
    diff = float((logits[0] - torch.from_numpy(exp["logits"])).abs().max())
    print(f"{hfdir}: {cfg.n_layers} layers, max |logit diff| vs tlm = {diff:.3g}")
    return 0 if diff < 1e-4 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        cmd_write(sys.argv[2])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "check":
        sys.exit(cmd_check(*sys.argv[2:]))
    else:
        sys.exit(__doc__)
