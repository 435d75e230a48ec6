"""Double-checks the reference and the fixtures it wrote.

Usage: /usr/bin/python3 tests/reference/check_reference.py OUTDIR   (after gen_fixtures.py OUTDIR)

1. File format: headers 8-aligned, tensors back to back in schema order, dtypes as promised.
2. Round trip: re-load config.json + model.safetensors with our reader, rebuild the Model and
   recompute logits/loss; must reproduce io.safetensors.
3. An independent float64 numpy forward written from the spec (per-position attention loop,
   per-pair RoPE rotation, per-element sinusoids) must agree with the stored logits and loss.
4. Pieces against PyTorch's own ops (F.gelu, F.layer_norm, F.cross_entropy), KV-cache
   incremental == full forward, finite-difference gradient spot checks, dropout on/off, and
   F16/BF16 round trips through the safetensors code.
"""

import math
import os
import struct
import sys
import json

import numpy as np
import torch
import torch.nn.functional as F

# Importing the modules beside this file leaves no __pycache__ in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as ref  # noqa: E402
from safetensors_io import read_header, read_safetensors, write_safetensors  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL", what)


# ----------------------------------------------------------------------------------------------
# Independent numpy forward (float64). Deliberately written differently from model.py.
# ----------------------------------------------------------------------------------------------


def np_norm(cfg, W, name, x):
    g = W[name + ".weight"]
    if cfg.norm == "rmsnorm":
        return np.stack([row * g / math.sqrt(float(np.dot(row, row)) / len(row) + cfg.norm_eps)
                         for row in x])
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    y = (x - mu) / np.sqrt(var + cfg.norm_eps) * g
    return y + W[name + ".bias"] if name + ".bias" in W else y


def np_linear(W, name, x):
    y = x @ W[name + ".weight"].T
    return y + W[name + ".bias"] if name + ".bias" in W else y


def np_rope(vec, pos, cfg):
    """Rotate one head vector by explicit 2x2 rotations, pair by pair."""
    hd = len(vec)
    out = vec.copy()
    for i in range(hd // 2):
        ang = pos * cfg.rope_theta ** (-2.0 * i / hd)
        a_idx, b_idx = (i, i + hd // 2) if cfg.rope_pairing == "half" else (2 * i, 2 * i + 1)
        rot = np.array([[math.cos(ang), -math.sin(ang)], [math.sin(ang), math.cos(ang)]])
        out[a_idx], out[b_idx] = rot @ np.array([vec[a_idx], vec[b_idx]])
    return out


def np_forward_one(cfg, W, ids, pos_offset):
    """One sequence ids [T] -> logits [T, V]."""
    T, d, H, KVH, hd = len(ids), cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    x = np.stack([W["token_embd.weight"][i] for i in ids])
    if cfg.embed_scale:
        x = x * cfg.embed_scale
    for t in range(T):
        p = pos_offset + t
        if cfg.position == "learned":
            x[t] += W["position_embd.weight"][p]
        elif cfg.position == "sinusoidal":
            for j in range(d):
                ang = p / 10000.0 ** ((j - j % 2) / d)
                x[t, j] += math.sin(ang) if j % 2 == 0 else math.cos(ang)

    def attention(l, h_in):
        pre = f"blk.{l}."
        q = np_linear(W, pre + "attn_q", h_in).reshape(T, H, hd)
        k = np_linear(W, pre + "attn_k", h_in).reshape(T, KVH, hd)
        v = np_linear(W, pre + "attn_v", h_in).reshape(T, KVH, hd)
        if cfg.position == "rope":
            q = np.array([[np_rope(q[t, h], pos_offset + t, cfg) for h in range(H)]
                          for t in range(T)])
            k = np.array([[np_rope(k[t, h], pos_offset + t, cfg) for h in range(KVH)]
                          for t in range(T)])
        out = np.zeros((T, H * hd))
        pattern, scale = cfg.sliding_window_pattern, cfg.attn_scale or 1.0 / math.sqrt(hd)
        window = cfg.sliding_window if pattern == 0 or (l + 1) % pattern else 0
        for t in range(T):  # explicit causal loop: query t looks at keys u0..t only
            u0 = max(0, t - window + 1) if window else 0
            for h in range(H):
                kvh = h // (H // KVH)
                s = np.array([np.dot(q[t, h], k[u, kvh]) * scale for u in range(u0, t + 1)])
                if cfg.attn_softcap:
                    s = cfg.attn_softcap * np.tanh(s / cfg.attn_softcap)
                e = np.exp(s - s.max())
                pr = e / e.sum()
                out[t, h * hd:(h + 1) * hd] = sum(pr[u - u0] * v[u, kvh] for u in range(u0, t + 1))
        return np_linear(W, pre + "attn_output", out)

    def ffn(l, h_in):
        pre = f"blk.{l}."
        up = np_linear(W, pre + "ffn_up", h_in)
        if cfg.ffn == "swiglu":
            g = np_linear(W, pre + "ffn_gate", h_in)
            act = g / (1.0 + np.exp(-g)) * up
        elif cfg.ffn == "geglu":
            g = np_linear(W, pre + "ffn_gate", h_in)
            act = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * up
        elif cfg.ffn == "gelu":
            act = np.vectorize(lambda z: 0.5 * z * (1.0 + math.erf(z / math.sqrt(2.0))))(up)
        elif cfg.ffn == "gelu_tanh":
            act = 0.5 * up * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (up + 0.044715 * up ** 3)))
        else:
            act = np.maximum(up, 0.0)
        return np_linear(W, pre + "ffn_down", act)

    for l in range(cfg.n_layers):
        pre = f"blk.{l}."
        if cfg.post_norms:
            a = attention(l, np_norm(cfg, W, pre + "attn_norm", x))
            x = x + np_norm(cfg, W, pre + "post_attention_norm", a)
            f = ffn(l, np_norm(cfg, W, pre + "ffn_norm", x))
            x = x + np_norm(cfg, W, pre + "post_ffw_norm", f)
        elif cfg.norm_position == "pre":
            x = x + attention(l, np_norm(cfg, W, pre + "attn_norm", x))
            x = x + ffn(l, np_norm(cfg, W, pre + "ffn_norm", x))
        else:
            x = np_norm(cfg, W, pre + "attn_norm", x + attention(l, x))
            x = np_norm(cfg, W, pre + "ffn_norm", x + ffn(l, x))
    if cfg.norm_position == "pre":
        x = np_norm(cfg, W, "output_norm", x)
    head = W["token_embd.weight"] if cfg.tie_embeddings else W["output.weight"]
    logits = x @ head.T
    if cfg.final_softcap:
        logits = cfg.final_softcap * np.tanh(logits / cfg.final_softcap)
    return logits


def np_loss(logits, targets):
    total, n = 0.0, 0
    for row, tgt in zip(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)):
        if tgt < 0:
            continue
        m = row.max()
        total += m + math.log(np.exp(row - m).sum()) - row[tgt]
        n += 1
    return total / n


# ----------------------------------------------------------------------------------------------


def check_fixture(case_dir, name):
    cfg = ref.Config.from_json(os.path.join(case_dir, "config.json"))
    schema = ref.tensor_schema(cfg)
    mpath = os.path.join(case_dir, "model.safetensors")
    header, _, start = read_header(mpath)
    check(start % 8 == 0, f"{name}: data section not 8-aligned")
    order = sorted(header, key=lambda n: header[n]["data_offsets"][0])
    check(order == [n for n, _ in schema], f"{name}: tensor order != schema")
    check(list(header) == order, f"{name}: JSON key order != data order")
    end = 0
    for n in order:
        info = header[n]
        check(info["dtype"] == "F32" and info["data_offsets"][0] == end, f"{name}: {n} layout")
        end = info["data_offsets"][1]
    check(os.path.getsize(mpath) == start + end, f"{name}: trailing bytes")
    weights, _ = read_safetensors(mpath)
    for n, shape in schema:
        check(weights[n].shape == tuple(shape), f"{name}: {n} shape")

    io, meta = read_safetensors(os.path.join(case_dir, "io.safetensors"))
    pos, B, T = int(meta["pos_offset"]), int(meta["B"]), int(meta["T"])
    check(io["ids"].dtype == np.int32 and io["ids"].shape == (B, T), f"{name}: ids")
    check(io["targets"].dtype == np.int32 and io["targets"].shape == (B, T), f"{name}: targets")
    check(io["logits"].shape == (B, T, cfg.vocab_size) and io["loss"].shape == (1,),
          f"{name}: logits/loss shapes")

    # Round trip through the torch reference.
    m = ref.Model(cfg)
    m.load_canonical(weights)
    m.eval()
    with torch.no_grad():
        logits, loss = m(torch.from_numpy(io["ids"]).long(), pos,
                         torch.from_numpy(io["targets"]).long())
    rt = np.abs(logits.numpy() - io["logits"]).max()
    check(rt == 0.0 and loss.item() == io["loss"][0], f"{name}: round trip differs ({rt})")

    # Independent float64 forward.
    W = {n: w.astype(np.float64) for n, w in weights.items()}
    ref_logits = np.stack([np_forward_one(cfg, W, io["ids"][b], pos) for b in range(B)])
    err = np.abs(ref_logits - io["logits"]).max()
    lerr = abs(np_loss(ref_logits, io["targets"]) - float(io["loss"][0]))
    check(err < 1e-4 and lerr < 1e-5, f"{name}: numpy forward differs: logits {err}, loss {lerr}")
    print(f"ok {name:30s} numpy-vs-torch max|dlogits|={err:.2e} |dloss|={lerr:.2e}")


def check_pieces():
    torch.manual_seed(0)
    x = torch.randn(5, 7, 24) * 3
    check(torch.allclose(ref.gelu_erf(x), F.gelu(x), atol=1e-6), "gelu_erf vs F.gelu")
    check(torch.allclose(ref.gelu_tanh(x), F.gelu(x, approximate="tanh"), atol=1e-6),
          "gelu_tanh vs F.gelu(tanh)")
    ln = ref.LayerNorm(24, 1e-5, True)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    check(torch.allclose(ln(x), F.layer_norm(x, (24,), ln.weight, ln.bias, 1e-5), atol=1e-5),
          "LayerNorm vs F.layer_norm")
    logits = torch.randn(3, 4, 11)
    tg = torch.randint(0, 11, (3, 4))
    tg[0, 1] = -1
    tg[2, 3] = -1
    check(torch.allclose(ref.cross_entropy(logits, tg),
                         F.cross_entropy(logits.view(-1, 11), tg.view(-1), ignore_index=-1)),
          "cross_entropy vs F.cross_entropy")
    check(ref.cross_entropy(logits, torch.full((3, 4), -1)).item() == 0.0, "all-ignored loss")
    # Defaults for d_ff.
    for d, want in ((32, 128), (48, 128), (64, 192), (96, 256), (100, 320), (768, 2048)):
        check(ref.default_d_ff(d, "swiglu") == want, f"default d_ff swiglu d={d}")
    check(ref.default_d_ff(48, "relu") == 192, "default d_ff relu")
    try:
        ref.Config.from_dict({"vocab_size": 8, "context_length": 4, "d_model": 8, "n_layers": 1,
                              "n_heads": 2, "bogus": 1})
        check(False, "unknown key accepted")
    except ValueError:
        pass


def tiny_models():
    import gen_fixtures as g
    index = {c["name"]: i for i, c in enumerate(g.CASES)}
    for name in ("llama", "gpt2", "post_layernorm_relu_learned", "sinusoidal_layernorm_nobias",
                 "gemma2_like"):
        i = index[name]
        yield g.CASES[i], g.make_case(g.CASES[i], i)


def check_kv_cache():
    for c, (cfg, _, m, ids, _) in tiny_models():
        start = min(2, cfg.context_length - ids.shape[1])  # also exercise a nonzero start
        with torch.no_grad():
            full, _ = m(ids, start)
            cache = [{} for _ in range(cfg.n_layers)]
            parts, t = [], 0
            for n in (3, 1, 1, ids.shape[1] - 5):  # a prefill then single steps then the rest
                lg, _ = m(ids[:, t:t + n], start + t, cache=cache)
                parts.append(lg)
                t += n
        err = (torch.cat(parts, 1) - full).abs().max().item()
        check(err < 1e-5, f"{c['name']}: KV cache incremental != full ({err})")
        print(f"ok {c['name']:30s} kv-cache max|d|={err:.2e}")


def check_grads():
    for c, (cfg, _, m, ids, tg) in tiny_models():
        m = m.double()
        _, loss = m(ids, c["pos_offset"], tg)
        loss.backward()
        grads = m.canonical_grads()
        gen = torch.Generator().manual_seed(0)
        worst = 0.0
        for name, p in m.canonical_params():
            check(grads[name] is not None, f"{c['name']}: no grad for {name}")
            flat, gflat = p.data.view(-1), grads[name].view(-1)
            for j in torch.randint(0, flat.numel(), (2,), generator=gen).tolist():
                old, eps = flat[j].item(), 1e-6
                with torch.no_grad():
                    flat[j] = old + eps
                    lp = m(ids, c["pos_offset"], tg)[1].item()
                    flat[j] = old - eps
                    lm = m(ids, c["pos_offset"], tg)[1].item()
                    flat[j] = old
                fd = (lp - lm) / (2 * eps)
                worst = max(worst, abs(fd - gflat[j].item()))
        check(worst < 1e-6, f"{c['name']}: finite differences disagree ({worst})")
        print(f"ok {c['name']:30s} grad-vs-finite-diff max|d|={worst:.2e}")


def check_dropout_and_record():
    cfg = ref.Config.from_dict({"vocab_size": 20, "context_length": 8, "d_model": 16,
                                "n_layers": 1, "n_heads": 2, "dropout": 0.5})
    m = ref.Model(cfg)
    ids = torch.randint(0, 20, (2, 8))
    m.eval()
    a, b = m(ids)[0], m(ids)[0]
    m.train()
    c = m(ids)[0]
    check(torch.equal(a, b) and not torch.equal(a, c), "dropout active only in train mode")
    m.eval()
    m.record = True
    m(ids)
    check({"embed", "blk.0.q", "blk.0.attn_probs", "blk.0.out", "final_norm",
           "logits"} <= set(m.acts), "recorded activations")


def check_safetensors_dtypes(tmp):
    t = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int32),
         "c": torch.randn(4).half(), "d": torch.randn(2, 3).bfloat16(), "e": torch.zeros(0, 4)}
    path = os.path.join(tmp, "dtypes.safetensors")
    write_safetensors(path, t, {"k": "v"})
    back, meta = read_safetensors(path)
    check(meta == {"k": "v"} and list(back) == list(t), "safetensors names/metadata")
    for k, v in t.items():
        check(np.array_equal(back[k], v.float().numpy() if k == "d" else v.numpy()),
              f"safetensors round trip {k}")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    check((8 + n) % 8 == 0 and h["d"]["dtype"] == "BF16" and h["c"]["dtype"] == "F16",
          "safetensors header")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_reference.py OUTDIR")
    torch.set_num_threads(1)
    root = os.path.join(sys.argv[1], "parity")
    with open(os.path.join(root, "cases.txt")) as f:
        names = [ln.strip() for ln in f if ln.strip()]
    for name in names:
        check_fixture(os.path.join(root, name), name)
    check_pieces()
    check_kv_cache()
    check_grads()
    check_dropout_and_record()
    check_safetensors_dtypes(root)
    os.remove(os.path.join(root, "dtypes.safetensors"))
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print(f"all checks passed ({len(names)} fixtures)")


if __name__ == "__main__":
    main()
