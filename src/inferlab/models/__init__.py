"""Models: ModelSpec (the architecture), its GGUF tensor inventory, and its sources
(Hugging Face config, GGUF header, safetensors headers, the built-in catalog)."""
