"""Stands in for the safetensors package: safetensors.torch.load_file only."""
