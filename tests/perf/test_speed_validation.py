"""The speed model's input checks: a batch is an integer >= 1 and a context an integer >= 0 tokens
(a bool is no count, though Python's True == 1), in every entry point, and each refusal is the typed
InvalidValueError naming the value; the smallest valid values pass (batch 1, context 0)."""

import pytest

from inferlab.errors import InvalidValueError
from inferlab.perf.placement import place
from inferlab.perf.speed import check_kv_room, decode_step_time, prefill_time, throughput

from _toy import DENSE, F32, MACHINE

BAD_BATCHES = [True, False, 2.5, 1.0, 0, -1, "2", None]
BAD_CONTEXTS = [True, 1.5, -1, "10", None]


def _p():
    return place(DENSE, MACHINE, F32, 2048, n_gpu_layers=5)


@pytest.mark.parametrize("batch", BAD_BATCHES)
def test_decode_refuses_a_batch_that_is_no_positive_integer(batch):
    with pytest.raises(InvalidValueError, match=r"batch must be an integer >= 1, got " + repr(batch).replace(".", r"\.")):
        decode_step_time(_p(), MACHINE, 10, batch=batch)


@pytest.mark.parametrize("batch", BAD_BATCHES)
def test_throughput_and_kv_room_refuse_the_same_batches(batch):
    with pytest.raises(InvalidValueError, match="batch must be an integer >= 1"):
        throughput(_p(), MACHINE, batch, 10)
    with pytest.raises(InvalidValueError, match="batch must be an integer >= 1"):
        check_kv_room(_p(), 10, batch)


@pytest.mark.parametrize("context", BAD_CONTEXTS)
def test_every_entry_point_refuses_a_context_that_is_no_token_count(context):
    p = _p()
    for call in (lambda: decode_step_time(p, MACHINE, context), lambda: check_kv_room(p, context),
                 lambda: prefill_time(p, MACHINE, 10, context=context)):
        with pytest.raises(InvalidValueError, match="context must be an integer >= 0 tokens"):
            call()


@pytest.mark.parametrize("n_tokens", [0, -5, True, "8", float("nan")])
def test_prefill_refuses_an_empty_or_odd_prompt(n_tokens):
    with pytest.raises(InvalidValueError, match="n_tokens"):
        prefill_time(_p(), MACHINE, n_tokens)


def test_the_smallest_valid_values_pass():
    # batch 1 at context 0 reads the GPU's weights only: 10,470,400 bytes (tests/_toy.py) at
    # 0.7 x 1,000 GB/s = 14.9577 us; a one-token prompt is valid too
    p = _p()
    d = decode_step_time(p, MACHINE, 0, batch=1)
    assert d["total_s"] == pytest.approx(10_470_400 / 700e9, rel=1e-12)
    check_kv_room(p, 0, 1)
    check_kv_room(p, 2048, 1)
    assert prefill_time(p, MACHINE, 1, context=0)["n_tokens"] == 1


def test_objects_of_the_wrong_kind_are_named():
    with pytest.raises(InvalidValueError, match="placement must be a Placement"):
        decode_step_time("rtx4090", MACHINE, 10)
    with pytest.raises(InvalidValueError, match="machine must be a Machine"):
        prefill_time(_p(), "rtx4090", 10)
