"""PyTorch peer for bench/generate: the reference model (tests/reference/model.py) with its KV
cache, same config, same thread count, same protocol as bench_gen.c: prefill tok/s over a prompt
in one call, then decode tok/s one token per call from a 1-token prompt, best of REPS after a
warm-up. Run with Debian's PyTorch: /usr/bin/python3.

usage: torch_peer.py CONFIG_JSON THREADS PROMPT_LEN DECODE_STEPS REPS"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "reference"))
from model import Config, Model  # noqa: E402


def main():
    cfg_path, threads, plen, steps, reps = sys.argv[1], *map(int, sys.argv[2:6])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    cfg = Config.from_json(cfg_path)
    m = Model(cfg).eval()
    ids = torch.tensor([[(i * 7919) % cfg.vocab_size for i in range(plen)]])
    best_p = best_d = 0.0
    with torch.inference_mode():
        for r in range(reps + 1):
            cache = [{} for _ in range(cfg.n_layers)]
            t0 = time.perf_counter()
            m(ids, cache=cache)
            tp = time.perf_counter() - t0
            cache = [{} for _ in range(cfg.n_layers)]
            logits, _ = m(ids[:, :1], cache=cache)
            t0 = time.perf_counter()
            for k in range(steps):
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                logits, _ = m(nxt, pos_offset=1 + k, cache=cache)
            td = time.perf_counter() - t0
            if r == 0:
                continue
            best_p, best_d = max(best_p, plen / tp), max(best_d, steps / td)
    print(f"torch {torch.__version__} ({threads} threads)  prefill {plen} tokens: {best_p:.1f} tok/s"
          f"   decode {steps} steps: {best_d:.1f} tok/s")
    print(f"RESULT torch prefill={best_p:.2f} decode={best_d:.2f}")


if __name__ == "__main__":
    main()
