"""The performance model: where a model's bytes go and how long they take.

``kv_size`` (KV bytes per token for every cache type), ``placement`` (llama.cpp's layer order and
``--fit``), ``speed`` (decode and prefill on the roofline; ``SpeedModel`` parameter sets),
``calibration`` (the speed model fitted on published llama-bench results) and ``cpu_model``
(llama.cpp's CPU kernels, measured per ggml type). Standard library only.
"""
