"""run.py for llama.cpp's convert_hf_to_gguf.py on a Gemma 2 directory: the converter runs
unchanged except its vocabulary step, which needs the sentencepiece package (Debian has none) and
a tokenizer.model; the tensors and keys are the converter's. Usage: run_novocab.py LLAMA_CPP_DIR
convert_hf_to_gguf.py ARGS... (PYTHONPATH: this directory, llama.cpp's gguf-py and its root).
Needs llama.cpp's source with its converters split into conversion/ (gemma.py)."""
import runpy
import sys

import torch

for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if not hasattr(torch, name):
        setattr(torch, name, type(name, (), {})())

sys.path.insert(0, sys.argv[1])
import conversion.gemma  # noqa: E402

conversion.gemma.Gemma2Model.set_vocab = lambda self: None
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
