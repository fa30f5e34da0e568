"""The GGML tensor types, as the quantization rules use them (defined with the model files'
vocabulary in ``models.ggml_types``)."""

from ..models.ggml_types import GGMLType, ggml_type, ggml_types, ggml_types_by_id

__all__ = ["GGMLType", "ggml_type", "ggml_types", "ggml_types_by_id"]
