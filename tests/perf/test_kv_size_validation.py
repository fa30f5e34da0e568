"""kv_size's input checks: token and sequence counts are integers (a bool is no count, though
Python's True == 1; 2.5 tokens is no count), >= 1 where a cache is sized; each refusal is the typed
InvalidValueError naming the argument. The smallest valid values give hand-derived bytes on the toy
model of tests/_toy.py (4 blocks x 512 bytes of f16 K/V per token)."""

import pytest

from inferlab.errors import InvalidValueError
from inferlab.perf.kv_size import kv_read_bytes, layer_kv_bytes

from _toy import DENSE


@pytest.mark.parametrize("context", [True, False, 2.5, "10", None])
def test_a_read_context_must_be_an_integer(context):
    with pytest.raises(InvalidValueError, match="context must be an integer number of tokens"):
        kv_read_bytes(DENSE, context)


def test_read_bytes_at_the_smallest_contexts():
    assert kv_read_bytes(DENSE, 0) == (0.0, 0.0, 0.0, 0.0)
    assert kv_read_bytes(DENSE, 1) == (512.0, 512.0, 512.0, 512.0)  # one token: 512 bytes per block


@pytest.mark.parametrize("name", ["n_seq", "n_ubatch"])
@pytest.mark.parametrize("value", [0, -1, True, 2.0, "4"])
def test_cache_sizing_counts_must_be_integers_of_at_least_one(name, value):
    with pytest.raises(InvalidValueError, match=f"{name} must be an integer >= 1, got"):
        layer_kv_bytes(DENSE, 1024, **{name: value})


@pytest.mark.parametrize("value", [0, True, 1.5])
def test_the_context_to_size_must_be_a_positive_integer(value):
    with pytest.raises(InvalidValueError, match="n_ctx"):
        layer_kv_bytes(DENSE, value)


def test_the_smallest_valid_counts_size_a_cache():
    # one cell, one sequence, a one-token micro-batch: 512 bytes per block
    assert layer_kv_bytes(DENSE, 1, n_seq=1, n_ubatch=1) == (512.0,) * 4
