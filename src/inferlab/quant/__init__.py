"""Quantization: the GGML type table (data), llama-quantize presets and per-tensor type rules."""
