"""Runs one of llama.cpp's Python converters (convert_lora_to_gguf.py) unchanged with what this
machine has: Debian's torch 1.13 and numpy, and the modules beside this file in place of the Python
packages Debian does not carry (transformers, safetensors, tqdm), which the converter imports but
needs only a little of. Usage: run.py CONVERTER.py ARGS... (PYTHONPATH: this directory, llama.cpp's
gguf-py and its root)."""
import runpy
import sys

import torch

# torch 1.13 predates these dtypes; the converter only names them in its tables.
for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if not hasattr(torch, name):
        setattr(torch, name, type(name, (), {})())

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
