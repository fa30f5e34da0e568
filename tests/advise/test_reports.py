"""The reports are clean typed data for the web app: frozen, strict JSON, every command a list of words."""

import dataclasses
import json

import pytest

from inferlab.api import advise, capacity, diagnose


@pytest.mark.parametrize("make", [
    lambda: capacity("llama-2-7b", "a100-40gb", engine="vllm", window=2048, target_sessions=80),
    lambda: capacity("qwen3-30b-a3b", "rtx4090", engine="llamacpp", kv_types=("f16", "q8_0", "q4_0")),
    lambda: capacity("llama-3.1-8b", "rtx4060ti", engine="sglang", kv_types=("f16", "fp8")),
    lambda: advise("qwen3-30b-a3b", "rtx4060ti", lora_rank=8),
    lambda: advise("llama-3.1-8b", "rtx4090", users=4, draft="llama-3.2-1b"),
    lambda: advise("gpt-oss-120b", "rtx4090"),
    lambda: diagnose("llama-3.1-70b", "rtx4090", flags="-ngl 99", observed_tok_s=0.5),
])
def test_reports_are_strict_json(make):
    r = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.model = "x"
    d = json.loads(r.to_json())
    assert d["kind"] == type(r).__name__ and d["schema_version"] >= 1
    text = json.dumps(d)
    assert "NaN" not in text and "Infinity" not in text
    for e in d.get("engines", []):
        assert isinstance(e["command"]["argv"], list) and e["command"]["text"].split()[0] in ("llama-server", "vllm", "python")
