"""KV-cache managers and the serving simulator (standard library only).

* ``simulator``: requests, the shared run loop, records, summaries, invariant checks
* ``slots`` (llama.cpp server), ``paged`` (vLLM v1), ``radix`` (SGLang): one engine each
* ``tokens``: token sequences as runs of consecutive ids (lazy trace prompts)
* ``workloads``, ``traces``: generated workloads, Mooncake / Azure loaders, arrival processes
* ``time_model``: step costs (from ``inferlab.perf_model``); ``pool``: KV pool sizes per engine

The seed's names live in ``inferlab.kv_managers``.
"""
