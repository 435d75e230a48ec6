"""Writes a random-weight llama2.c legacy .bin (the shapes of karpathy's stories15M/110M) for the
decode benchmark. numpy only.   random_llama2c.py OUT.bin DIM HIDDEN LAYERS HEADS VOCAB SEQ_LEN"""
import struct
import sys

import numpy as np

out, dim, hidden, layers, heads, vocab, seq = sys.argv[1], *map(int, sys.argv[2:])
rng = np.random.default_rng(0)
hd = dim // heads


def w(*shape, scale=None):
    fan_in = shape[-1]
    return (rng.standard_normal(shape, dtype=np.float32) * (scale or fan_in ** -0.5)).astype("<f4")


with open(out, "wb") as f:
    f.write(struct.pack("<7i", dim, hidden, layers, heads, heads, vocab, seq))  # shared classifier
    f.write(w(vocab, dim, scale=0.5).tobytes())
    f.write(np.ones((layers, dim), "<f4").tobytes())                  # attention norms
    for shape in ((dim, dim), (dim, dim), (dim, dim), (dim, dim)):    # wq, wk, wv, wo
        f.write(w(layers, *shape).tobytes())
    f.write(np.ones((layers, dim), "<f4").tobytes())                  # ffn norms
    f.write(w(layers, hidden, dim).tobytes())                         # w1 (gate)
    f.write(w(layers, dim, hidden).tobytes())                         # w2 (down)
    f.write(w(layers, hidden, dim).tobytes())                         # w3 (up)
    f.write(np.ones(dim, "<f4").tobytes())                            # final norm
    f.write(np.zeros(seq * hd, "<f4").tobytes())                      # legacy RoPE tables (unused)
