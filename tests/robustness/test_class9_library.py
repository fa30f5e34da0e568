"""Class 9: the library's public functions, fuzzed (hypothesis, derandomized): each argument in
turn given a wrong type (None, a name string, a list, a bool, an arbitrary object) or a nonsense
number (NaN, +-inf, negative, huge), the others valid. A call either answers (a valid reading, e.g. a
name where names are accepted, with finite numbers) or raises one of inferlab's typed errors; never
AttributeError, TypeError, ZeroDivisionError, OverflowError... from inside."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlab.errors import InferlabError

SETTINGS = settings(max_examples=40, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class _Thing:  # an object of no expected type
    pass


BAD = st.one_of(
    st.none(), st.booleans(), st.sampled_from(["", "llama-3.1-8b", "rtx4090", "nonsense", "Q4_K_M", "nan"]),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(10**20), max_value=-1),
    st.sampled_from([0, 10**30, 2**63, 1.5, -0.0]), st.lists(st.integers(0, 3), max_size=2), st.builds(_Thing),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


def _finite(x) -> bool:
    if isinstance(x, float):
        return not math.isnan(x)  # inf may be honest (a device that never saturates); NaN never is
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(_finite(v) for v in x)
    return True


def _setup():
    from inferlab.hardware.catalog import MACHINES
    from inferlab.models.catalog import MODELS
    from inferlab.perf.placement import place

    spec, machine = MODELS["qwen2.5-0.5b"], MACHINES["rtx4090"]
    return spec, machine, place(spec, machine, "Q4_K_M", 4096)


def _targets():
    """(name, function, valid keyword arguments); each argument is fuzzed in turn."""
    from inferlab import api
    from inferlab.hardware.resolve import resolve_machine
    from inferlab.kv.workloads import WORKLOADS
    from inferlab.models.resolve import resolve_model
    from inferlab.perf.kv_size import kv_bytes_per_token, kv_cache_bytes
    from inferlab.perf.placement import place
    from inferlab.perf.speed import decode_step_time, prefill_time
    from inferlab.quant.plan import tensor_plan, weight_bytes

    spec, machine, p = _setup()
    reqs = WORKLOADS["seed-chat"]()
    return [
        ("place", place, dict(model=spec, machine=machine, quant="Q4_K_M", n_ctx=4096, kv_type="f16", n_gpu_layers=None)),
        ("decode_step_time", decode_step_time, dict(placement=p, machine=machine, context=1024, batch=1)),
        ("prefill_time", prefill_time, dict(placement=p, machine=machine, n_tokens=512, context=0)),
        ("kv_bytes_per_token", kv_bytes_per_token, dict(model=spec, kv_type="f16")),
        ("kv_cache_bytes", kv_cache_bytes, dict(model=spec, n_ctx=4096, kv_type="f16", n_seq=1)),
        ("tensor_plan", tensor_plan, dict(model=spec, quant="Q4_K_M")),
        ("weight_bytes", weight_bytes, dict(model=spec, quant="Q4_K_M")),
        ("resolve_model", resolve_model, dict(model="qwen2.5-0.5b")),
        ("resolve_machine", resolve_machine, dict(machine="rtx4090")),
        ("api.fit", api.fit, dict(model="qwen2.5-0.5b", machine="rtx4090", quant=None, n_ctx=4096, n_gpu_layers=None,
                                  context=None, n_prompt=256)),
        ("api.plan", api.plan, dict(source="qwen2.5-0.5b", quant="Q4_K_M")),
        ("api.simulate", api.simulate, dict(requests=reqs, engines="vllm", capacity_tokens=384)),
    ]


def _call(fn, kwargs):
    import inspect

    params = inspect.signature(fn).parameters
    pos = [k for k, v in params.items() if v.kind == v.POSITIONAL_ONLY]
    return fn(*[kwargs.pop(k) for k in pos], **kwargs)


TARGETS = _targets()
# how a message may name an argument: by its name, or by the flag or the thing it is
ALIASES = {"n_ctx": ("n_ctx", "-c", "context"), "model": ("model",), "source": ("model", "source"), "quant": ("quant", "preset", "ggml type"),
           "kv_type": ("kv",), "n_prompt": ("n_prompt", "prompt"), "requests": ("request",), "engines": ("engine",)}
CASES = [(name, arg) for name, _, kw in TARGETS for arg in kw]


@pytest.mark.parametrize("name,arg", CASES, ids=[f"{n}-{a}" for n, a in CASES])
@SETTINGS
@given(value=BAD)
def test_a_bad_argument_is_a_typed_error_or_a_valid_reading(name, arg, value):
    fn, kw = next((f, k) for n, f, k in TARGETS if n == name)
    kwargs = {**kw, arg: value}
    try:
        out = _call(fn, kwargs)
    except InferlabError as exc:
        words = ALIASES.get(arg, (arg,))
        assert any(w.lower() in str(exc).lower() for w in words), f"{name}({arg}={value!r}): {exc}"  # names the argument
        return
    except Exception as exc:  # noqa: BLE001  the point of the test
        raise AssertionError(f"{name}({arg}={value!r}) raised {type(exc).__name__}: {exc}") from exc
    d = out.to_dict() if hasattr(out, "to_dict") else out
    assert _finite(d), f"{name}({arg}={value!r}) answered with NaN"


def test_the_facades_too():
    from inferlab import inference_trace, kv_managers, perf_model

    spec, machine, p = _setup()
    for call in (lambda: perf_model.place(None, machine), lambda: perf_model.place(spec, None),
                 lambda: perf_model.place(spec, machine, n_ctx=float("nan")),
                 lambda: perf_model.place(spec, machine, n_gpu_layers=-1),
                 lambda: inference_trace.decode_curve(p, machine, [float("nan")]),
                 lambda: inference_trace.decode_curve(p, machine, [1024], batch=0),
                 lambda: inference_trace.load_steps(p, machine, disk_gbps=float("nan")),
                 lambda: inference_trace.request_timeline(p, machine, -1, 4),
                 lambda: inference_trace.request_timeline(p, machine, 16, float("inf")),
                 lambda: kv_managers.compare(capacity_tokens=-1), lambda: kv_managers.compare(capacity_tokens=float("nan"))):
        with pytest.raises(InferlabError):
            call()
