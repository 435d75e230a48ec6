"""Write forward-parity fixtures for the C implementation.

Usage: /usr/bin/python3 tests/reference/gen_fixtures.py OUTDIR

For each case NAME this writes
    OUTDIR/parity/NAME/config.json        the config as the C side should read it
    OUTDIR/parity/NAME/model.safetensors  every parameter, F32, canonical names and order
    OUTDIR/parity/NAME/io.safetensors     ids, targets (I32 [B,T]), logits (F32 [B,T,V]), grad.NAME,
                                          loss (F32 [1]), imatrix.NAME (each matrix's input columns'
                                          squared activations summed over a pass from position 0);
                                          metadata pos_offset, B, T
and OUTDIR/parity/cases.txt with the case names, one per line. Deterministic: each case seeds
its own generator from its index.
"""

import json
import os
import sys
import time

import torch

# Importing the modules beside this file leaves no __pycache__ in the source tree.
sys.dont_write_bytecode = True
import gen_optim  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Model  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402


def case(name, B, T, pos_offset=0, ignore=False, omit=(), **config):
    """One parity case. `omit` lists config keys left out of config.json so the C side has to
    derive them (the generator still uses the finalized values)."""
    return dict(name=name, B=B, T=T, pos_offset=pos_offset, ignore=ignore, omit=omit,
                config=config)


CASES = [
    # GPT-2 style: LayerNorm with biases, tanh GELU, learned positions, tied head.
    case("gpt2", B=2, T=16, ignore=True,
         vocab_size=96, context_length=16, d_model=64, n_layers=2, n_heads=4,
         norm="layernorm", bias=True, ffn="gelu_tanh", position="learned", tie_embeddings=True),
    # Llama style: RMSNorm, SwiGLU, interleaved RoPE, GQA 4q/2kv, untied, continuing at pos 5.
    case("llama", B=2, T=12, pos_offset=5,
         vocab_size=128, context_length=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
         norm="rmsnorm", norm_eps=1e-6, ffn="swiglu", position="rope", rope_pairing="interleaved",
         tie_embeddings=False, bias=False),
    # Only the required keys: everything else comes from the defaults (d_ff = 192 for d = 64).
    case("defaults", B=1, T=10,
         omit=("n_kv_heads", "d_ff", "norm", "norm_eps", "norm_position", "ffn", "position",
               "rope_theta", "rope_pairing", "tie_embeddings", "bias", "dropout"),
         vocab_size=80, context_length=24, d_model=64, n_layers=2, n_heads=4),
    # Qwen2 style: biases on q, k and v only, halves RoPE (NEOX), GQA 4q/2kv, tied, pos 3.
    case("qwen2_qkv_bias", B=2, T=10, pos_offset=3,
         vocab_size=120, context_length=24, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
         norm="rmsnorm", norm_eps=1e-6, ffn="swiglu", position="rope", rope_pairing="half",
         rope_theta=1000000.0, tie_embeddings=True, bias=False, qkv_bias=True),
    # Multi-query attention (6 query heads share 1 kv head), biases everywhere, exact GELU.
    case("mqa_bias_gelu", B=2, T=9, pos_offset=7, ignore=True,
         vocab_size=100, context_length=20, d_model=96, n_layers=1, n_heads=6, n_kv_heads=1,
         norm="rmsnorm", ffn="gelu", position="rope", rope_pairing="half", bias=True,
         tie_embeddings=False),
    # Post-norm (no output_norm), LayerNorm + bias, ReLU, learned positions from pos 3.
    case("post_layernorm_relu_learned", B=2, T=11, pos_offset=3,
         vocab_size=70, context_length=24, d_model=48, n_layers=2, n_heads=4,
         norm="layernorm", norm_position="post", ffn="relu", position="learned", bias=True,
         tie_embeddings=False),
    # Post-norm RMSNorm + SwiGLU with biases on the linears only; d_ff not a multiple of 64;
    # T = context_length.
    case("post_rmsnorm_swiglu_rope", B=1, T=16,
         vocab_size=90, context_length=16, d_model=64, n_layers=2, n_heads=2, d_ff=100,
         norm="rmsnorm", norm_position="post", ffn="swiglu", position="rope",
         rope_pairing="interleaved", bias=True, tie_embeddings=True),
    # Sinusoidal positions from pos 4, LayerNorm WITHOUT bias, exact GELU, d_ff defaulted (4d).
    case("sinusoidal_layernorm_nobias", B=3, T=7, pos_offset=4, omit=("d_ff",),
         vocab_size=60, context_length=32, d_model=48, n_layers=2, n_heads=3,
         norm="layernorm", ffn="gelu", position="sinusoidal", bias=False, tie_embeddings=True),
    # Sinusoidal + post-norm + tanh GELU, T = context_length, untied.
    case("sinusoidal_post_gelu_tanh", B=2, T=12, ignore=True,
         vocab_size=50, context_length=12, d_model=32, n_layers=2, n_heads=4,
         norm="layernorm", norm_position="post", ffn="gelu_tanh", position="sinusoidal",
         bias=True, tie_embeddings=False),
    # No positional information at all; GQA 4/2; ReLU; biases.
    case("nope_gqa_relu", B=2, T=8, ignore=True,
         vocab_size=110, context_length=16, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
         norm="rmsnorm", ffn="relu", position="none", bias=True, tie_embeddings=False),
    # One token at the last position (a decode step without cache), large rope_theta.
    case("t1_rope_last_pos", B=2, T=1, pos_offset=31,
         vocab_size=120, context_length=32, d_model=64, n_layers=2, n_heads=4,
         norm="rmsnorm", ffn="swiglu", position="rope", rope_pairing="half",
         rope_theta=500000.0, tie_embeddings=True),
    # One token with learned positions at pos 10.
    case("t1_learned", B=1, T=1, pos_offset=10,
         vocab_size=64, context_length=16, d_model=32, n_layers=1, n_heads=2,
         norm="layernorm", ffn="gelu", position="learned", bias=True, tie_embeddings=True),
    # One token with sinusoidal positions at pos 9.
    case("t1_sinusoidal", B=3, T=1, pos_offset=9,
         vocab_size=72, context_length=12, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
         norm="rmsnorm", ffn="relu", position="sinusoidal", tie_embeddings=False),
    # Three layers, MQA with 2 heads, small rope_theta (fast-turning pairs), big norm_eps so a
    # misplaced eps shows, T = context_length.
    case("deep3_rope_half", B=2, T=20,
         vocab_size=150, context_length=20, d_model=32, n_layers=3, n_heads=2, n_kv_heads=1,
         norm="rmsnorm", norm_eps=1e-2, ffn="swiglu", position="rope", rope_pairing="half",
         rope_theta=100.0, tie_embeddings=False),
    # Post-norm with no positions and bias-free LayerNorm; larger vocab.
    case("post_nope_layernorm", B=2, T=6, pos_offset=2,
         vocab_size=300, context_length=8, d_model=48, n_layers=1, n_heads=6, n_kv_heads=3,
         norm="layernorm", norm_position="post", ffn="gelu", position="none", bias=False,
         tie_embeddings=True),
    # A long window: attention runs in blocks of 64 queries (64, 128, 150 here) that skip the
    # fully masked key blocks; GQA, rope and an offset on top.
    case("long_blocks_gqa", B=2, T=150, pos_offset=3, ignore=True,
         vocab_size=40, context_length=160, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2,
         norm="rmsnorm", ffn="swiglu", position="rope", rope_pairing="half",
         tie_embeddings=True),
    # Mistral's sliding window in every layer: each query sees its last 5 keys; GQA, an offset.
    case("window_every_layer", B=2, T=24, pos_offset=2,
         vocab_size=90, context_length=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
         norm="rmsnorm", ffn="swiglu", position="rope", rope_pairing="interleaved",
         tie_embeddings=False, sliding_window=5),
    # Gemma's pattern: two windowed layers, then a global one; long enough that blocks of queries
    # start past the window (the products leave out the keys before it).
    case("window_pattern_long", B=1, T=150, pos_offset=1,
         vocab_size=40, context_length=160, d_model=32, n_layers=3, n_heads=2, n_kv_heads=1,
         norm="rmsnorm", ffn="swiglu", position="rope", rope_pairing="half",
         tie_embeddings=True, sliding_window=40, sliding_window_pattern=3),
    # Gemma 2's layer features, each alone, with caps low enough that tanh bends the values here.
    # GEGLU: gelu_tanh(gate) * up, d_ff derived as swiglu's; biases on the linears.
    case("geglu", B=2, T=10, pos_offset=1, omit=("d_ff",),
         vocab_size=70, context_length=16, d_model=64, n_layers=2, n_heads=4,
         norm="rmsnorm", ffn="geglu", position="rope", bias=True, tie_embeddings=False),
    # Soft-capped attention scores over more than one block of 64 queries, GQA, a scale of its own.
    case("attn_softcap_long", B=1, T=70, pos_offset=2,
         vocab_size=50, context_length=80, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
         norm="rmsnorm", ffn="swiglu", position="rope", tie_embeddings=True, attn_softcap=1.5),
    case("attn_scale", B=2, T=9,
         vocab_size=60, context_length=16, d_model=64, n_layers=1, n_heads=2,
         norm="rmsnorm", ffn="gelu", position="rope", tie_embeddings=False, attn_scale=0.3),
    # Soft-capped logits: the loss and every gradient through the cap.
    case("final_softcap", B=2, T=8, ignore=True,
         vocab_size=90, context_length=12, d_model=32, n_layers=2, n_heads=2,
         norm="layernorm", bias=True, ffn="gelu_tanh", position="learned", tie_embeddings=False,
         final_softcap=3.0),
    # The embedding scaled into the blocks, the tied head reading the table unscaled.
    case("embed_scale_tied", B=2, T=8, pos_offset=3,
         vocab_size=80, context_length=16, d_model=64, n_layers=2, n_heads=4,
         norm="rmsnorm", ffn="swiglu", position="sinusoidal", tie_embeddings=True,
         embed_scale=8.0),
    # Norms after attention and after the FFN (LayerNorm with biases: their biases too).
    case("post_norms_layernorm", B=2, T=7,
         vocab_size=64, context_length=12, d_model=48, n_layers=2, n_heads=3,
         norm="layernorm", bias=True, ffn="gelu", position="learned", tie_embeddings=True,
         post_norms=True),
    # Gemma 2's layers together: windowed then global layers, both caps, the embedding scaled by
    # sqrt(d), query_pre_attn_scalar 32, four norms a block, GEGLU, GQA, tied.
    case("gemma2_like", B=2, T=40, pos_offset=1,
         vocab_size=96, context_length=48, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2,
         norm="rmsnorm", norm_eps=1e-6, ffn="geglu", position="rope", rope_pairing="half",
         tie_embeddings=True, sliding_window=6, sliding_window_pattern=2, attn_softcap=2.0,
         final_softcap=4.0, embed_scale=8.0, attn_scale=32 ** -0.5, post_norms=True),
    # Mixtral's sparse blocks: top 2 of 4 experts renormalised, both router losses; GQA, untied.
    case("moe_mixtral_like", B=2, T=6, pos_offset=2, ignore=True,
         vocab_size=64, context_length=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
         ffn="swiglu", tie_embeddings=False, n_experts=4, n_experts_used=2, expert_d_ff=24,
         expert_weights_norm=True, router_aux_loss_coef=0.02, router_z_loss_coef=0.001),
    # OLMoE's: top 2 of 8 with the softmax probabilities as they are; tied.
    case("moe_olmoe_like", B=2, T=5,
         vocab_size=48, context_length=12, d_model=32, n_layers=2, n_heads=2,
         ffn="swiglu", tie_embeddings=True, n_experts=8, n_experts_used=2, expert_d_ff=16,
         router_aux_loss_coef=0.01, router_z_loss_coef=0.001),
    # Qwen2-MoE's: top 2 of 4 not renormalised, a shared expert twice an expert's width.
    case("moe_qwen2_shared", B=2, T=6, pos_offset=1,
         vocab_size=56, context_length=12, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
         ffn="swiglu", qkv_bias=True, tie_embeddings=True, n_experts=4, n_experts_used=2,
         expert_d_ff=16, n_shared_experts=2, router_aux_loss_coef=0.001),
    # Experts among Gemma 2's layers: windows, caps, post norms, GEGLU; top 1 of 3 (renormalised
    # to weight 1: the router learns from the losses alone) plus a shared expert.
    case("moe_gemma_window", B=2, T=7,
         vocab_size=40, context_length=16, d_model=32, n_layers=2, n_heads=2,
         norm_eps=1e-6, ffn="geglu", tie_embeddings=True, sliding_window=3,
         sliding_window_pattern=2, attn_softcap=3.0, final_softcap=5.0, embed_scale=4.0,
         post_norms=True, n_experts=3, n_experts_used=1, expert_d_ff=16,
         expert_weights_norm=True, n_shared_experts=1, router_aux_loss_coef=0.05,
         router_z_loss_coef=0.01),
    # Post-norm blocks with LayerNorm and 3 of 4 experts chosen, no router losses.
    case("moe_post_layernorm", B=1, T=8,
         vocab_size=50, context_length=12, d_model=24, n_layers=2, n_heads=2,
         norm="layernorm", norm_position="post", ffn="swiglu", position="learned",
         tie_embeddings=False, n_experts=4, n_experts_used=3, expert_d_ff=12),
]


def randomize(model, gen):
    """Random weights with every gain and bias visibly different from 1 / 0 so that a missing
    term shows up, while keeping logits around 1..10."""
    with torch.no_grad():
        for name, p in model.canonical_params():
            if name == "token_embd.weight":
                # Also the LM head when tied: logits ~ N(0, (0.2^2)·d), i.e. std 1.1..2 here.
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name == "position_embd.weight":
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("ffn_gate_inp.weight"):
                # routers: logits spread wide, so that no row's choice is a near tie (route_margin)
                p.copy_(4.0 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            else:  # a matrix [out, in], experts' [E, out, in], the shared expert's gate [in]
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def route_margin(model, ids, pos_offset):
    """The smallest gap, over every layer's rows, between the router logits of the last expert
    chosen and the first one left out (inf for dense models or when every expert is used): a
    choice closer than the products' rounding (bf16's especially) could go either way."""
    cfg = model.cfg
    if not cfg.n_experts or cfg.n_experts_used == cfg.n_experts:
        return float("inf")
    with torch.no_grad():
        model(ids, pos_offset=pos_offset)
    k, worst = cfg.n_experts_used, float("inf")
    for blk in model.blocks:
        top = torch.sort(blk.ffn.router_logits, dim=-1, descending=True).values
        worst = min(worst, (top[:, k - 1] - top[:, k]).min().item())
    return worst


def make_case(c, index):
    """Build the model and inputs for case `c`; returns (cfg, config_json_dict, model, ids,
    targets)."""
    cfg = Config.from_dict(dict(c["config"]))
    written = {k: v for k, v in cfg.to_dict().items() if k not in c["omit"]}
    torch.manual_seed(1000 + index)
    gen = torch.Generator().manual_seed(1000 + index)
    model = Model(cfg)
    randomize(model, gen)
    model.eval()
    B, T = c["B"], c["T"]
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    # Experts: weights redrawn (deterministically) until every routing choice is clear.
    for attempt in range(200):
        if route_margin(model, ids, c["pos_offset"]) > 0.25:
            break
        randomize(model, gen)
    else:
        raise RuntimeError(f"{c['name']}: no weights with clear routing choices")
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    if c["ignore"]:
        # Ignore a few positions, including a first and a last one, but never a whole batch.
        flat = targets.view(-1)
        flat[0] = -1
        flat[-1] = -1
        flat[(B * T) // 2] = -1
    return cfg, written, model, ids, targets


def imatrix_sums(model, ids):
    """llama-imatrix's statistics of one forward pass from position 0: for every matrix of the
    blocks and output.weight (untied), each input column's squared activations summed over the
    B*T rows (float64, then F32), by the weight's canonical name."""
    by_param = {id(p): n for n, p in model.canonical_params()}
    sums, hooks = {}, []
    for mod in model.modules():
        if not isinstance(mod, torch.nn.Linear) or id(mod.weight) not in by_param:
            continue
        name = by_param[id(mod.weight)]

        def hook(m, inputs, name=name):
            x = inputs[0].detach().double().reshape(-1, inputs[0].shape[-1])
            sums[name] = (x * x).sum(0)
        hooks.append(mod.register_forward_pre_hook(hook))
    record = model.record
    model.record = True
    with torch.no_grad():
        model(ids, pos_offset=0)
    model.record = record
    for h in hooks:
        h.remove()
    if "output.weight" in by_param.values():  # the head is F.linear on its weight: no hook
        x = model.acts["final_norm"].double().reshape(-1, model.cfg.d_model)
        sums["output.weight"] = (x * x).sum(0)
    return [("imatrix." + n, v.float()) for n, v in sorted(sums.items())]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_fixtures.py OUTDIR")
    torch.set_num_threads(1)
    root = os.path.join(sys.argv[1], "parity")
    os.makedirs(root, exist_ok=True)
    t0 = time.time()
    names = []
    for index, c in enumerate(CASES):
        cfg, written, model, ids, targets = make_case(c, index)
        model.zero_grad()
        logits, loss = model(ids, pos_offset=c["pos_offset"], targets=targets)
        # What training minimises (the router losses of a mixture of experts added): its
        # gradients; "loss" stays the cross-entropy, which evaluation reports.
        train_loss = model.train_loss(loss)
        train_loss.backward()
        extra = []
        if cfg.n_experts:
            extra = [("loss_train", train_loss.detach().reshape(1).float()),
                     ("router_aux", model.router_aux.detach().reshape(1).float()),
                     ("router_z", model.router_z.detach().reshape(1).float())]
        # Gradients of the mean loss for every parameter, for the backward-pass parity test.
        grads = [("grad." + n, g.float()) for n, g in model.canonical_grads().items()]
        logits, loss = logits.detach(), loss.detach()
        imatrix = imatrix_sums(model, ids)
        d = os.path.join(root, c["name"])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(written, f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(d, "model.safetensors"),
                          [(n, t.float()) for n, t in model.state_dict_canonical().items()])
        write_safetensors(
            os.path.join(d, "io.safetensors"),
            [("ids", ids.to(torch.int32)), ("targets", targets.to(torch.int32)),
             ("logits", logits.float()), ("loss", loss.reshape(1).float())] + extra + grads
            + imatrix,
            metadata={"pos_offset": str(c["pos_offset"]), "B": str(c["B"]), "T": str(c["T"])})
        names.append(c["name"])
        print(f"{c['name']:30s} B={c['B']} T={c['T']:2d} pos={c['pos_offset']:2d} "
              f"max|logits|={logits.abs().max().item():7.3f} loss={loss.item():.4f}")
    with open(os.path.join(root, "cases.txt"), "w") as f:
        f.write("".join(n + "\n" for n in names))
    print(f"{len(names)} cases written to {root} in {time.time() - t0:.2f} s")
    gen_optim.main(sys.argv[1])
    import gen_lora  # noqa: E402 (imports this module's randomize)

    gen_lora.main(sys.argv[1])


if __name__ == "__main__":
    main()
