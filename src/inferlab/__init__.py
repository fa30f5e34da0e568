"""inferlab: does it fit, where do the bytes live, how fast will it run.

The core (``perf_model``, ``kv_managers``, ``inference_trace`` and what they use) needs only
the standard library; file readers, the torch runtime, plots and the CLI live at the edges.
"""

__version__ = "0.1.0"
