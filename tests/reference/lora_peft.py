"""A PEFT LoRA directory as PEFT saves one for a tiny Llama, and what it means in GGUF terms.

usage: lora_peft.py OUTDIR

Writes OUTDIR/peft/ (adapter_config.json + adapter_model.safetensors, names and layout of
PEFT's save_pretrained for LlamaForCausalLM, rsLoRA on, layer 1 in bfloat16) and
OUTDIR/expected.safetensors holding, for each adapted base tensor under its GGUF name:
  NAME.lora_b  B with its rows in the GGUF file's order (q and k permuted per head exactly as
               llama.cpp's convert_hf_to_gguf.py permutes the base's rows, which
               convert_lora_to_gguf.py applies to lora_b), float32;
  NAME.delta   the weight update s * B @ A that the adapter adds to the GGUF base, float32.
The shapes are tests/test_lora_files.c's: d 32, 4 heads of 8, 2 KV heads, FFN 48, vocab 50,
2 layers, r 4, alpha 8.
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import write_safetensors  # noqa: E402

D, HEADS, KV_HEADS, FF, VOCAB, LAYERS, R, ALPHA = 32, 4, 2, 48, 50, 2, 4, 8.0
HD = D // HEADS

# HF module -> (GGUF kind, in, out)
MODULES = {
    "self_attn.q_proj": ("attn_q", D, D),
    "self_attn.k_proj": ("attn_k", D, HD * KV_HEADS),
    "self_attn.v_proj": ("attn_v", D, HD * KV_HEADS),
    "self_attn.o_proj": ("attn_output", D, D),
    "mlp.gate_proj": ("ffn_gate", D, FF),
    "mlp.up_proj": ("ffn_up", D, FF),
    "mlp.down_proj": ("ffn_down", FF, D),
}


def hf_to_gguf_rows(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's half-order rows -> interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main(outdir):
    gen = torch.Generator().manual_seed(44)
    os.makedirs(os.path.join(outdir, "peft"), exist_ok=True)
    scale = ALPHA / math.sqrt(R)  # use_rslora
    tensors, expected = {}, {}

    def add(hf_module, gguf_name, n_in, n_out, dtype, n_head=None):
        a = (torch.rand(R, n_in, generator=gen) * 2 - 1).to(dtype)
        b = (torch.rand(n_out, R, generator=gen) * 2 - 1).to(dtype)
        tensors["base_model.model.%s.lora_A.weight" % hf_module] = a
        tensors["base_model.model.%s.lora_B.weight" % hf_module] = b
        a32, b32 = a.float(), b.float()
        bg = hf_to_gguf_rows(b32, n_head) if n_head else b32
        expected[gguf_name + ".lora_b"] = bg.contiguous()
        expected[gguf_name + ".delta"] = (scale * (bg.double() @ a32.double())).float()

    for layer in range(LAYERS):
        dtype = torch.float32 if layer == 0 else torch.bfloat16
        for mod, (kind, n_in, n_out) in MODULES.items():
            heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(kind)
            add("model.layers.%d.%s" % (layer, mod), "blk.%d.%s.weight" % (layer, kind), n_in, n_out,
                dtype, heads)
    add("lm_head", "output.weight", D, VOCAB, torch.float32)

    write_safetensors(os.path.join(outdir, "peft", "adapter_model.safetensors"), tensors,
                      metadata={"format": "pt"})
    config = {
        "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "tiny-llama",
        "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "init_lora_weights": True, "layers_pattern": None, "layers_to_transform": None,
        "loftq_config": {}, "lora_alpha": ALPHA, "lora_dropout": 0.1, "megatron_config": None,
        "megatron_core": "megatron.core", "modules_to_save": None, "peft_type": "LORA", "r": R,
        "rank_pattern": {}, "revision": None,
        "target_modules": ["down_proj", "v_proj", "lm_head", "q_proj", "o_proj", "up_proj",
                           "k_proj", "gate_proj"],
        "task_type": "CAUSAL_LM", "use_dora": False, "use_rslora": True,
    }
    with open(os.path.join(outdir, "peft", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors(os.path.join(outdir, "expected.safetensors"), expected)


if __name__ == "__main__":
    main(sys.argv[1])
