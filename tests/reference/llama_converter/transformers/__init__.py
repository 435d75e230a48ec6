"""Stands in for Hugging Face transformers in llama.cpp's converters: there is no hub here, so the
configuration loaders fail and the converter reads config.json itself, as it does without one."""


class AutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers is not installed: read config.json")


class AutoTokenizer:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers is not installed")
