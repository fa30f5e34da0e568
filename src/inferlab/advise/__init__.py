"""Advice built on the placement and speed model: capacity per engine, engine commands checked
against each engine's own argument table, placement ranking, LoRA and speculative decoding, diagnosis.

Every figure here comes from ``perf.placement.place`` and ``perf.speed`` (through
``api.setup.configure``); this package adds the engines' own accounting and the search.
"""
