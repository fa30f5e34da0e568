"""The server's parts without a browser: figure 1's reading of the load trace, `--on local`, and
the memory of answers."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from inferlab.api import configure
from inferlab.api.trace import load_trace
from inferlab.perf.trace import device_labels
from inferlab.web.app import create_app
from inferlab.web.loading import known, tier_states

SCENARIOS = [("llama-3.1-8b", "rtx4090", None), ("qwen2.5-32b", "rtx4060ti", None), ("llama-3.1-8b", "m4max", None),
             ("llama-3.1-8b", "cpu-ddr5", None), ("llama-3.1-70b", "2x-rtx3090", None), ("qwen2.5-32b", "rtx4060ti", 65)]


@pytest.mark.parametrize("model,machine,ngl", SCENARIOS)
def test_every_load_step_is_read_and_the_bars_end_full(model, machine, ngl):
    setup = configure(model, machine, n_ctx=8192, n_gpu_layers=ngl)
    tr = load_trace(setup).to_dict()
    labels = list(device_labels(setup.placement))
    for st in tr["steps"] + tr["second_launch"]:
        assert known(st["name"], st["where"], labels), st["name"]  # a new kind of step would leave the bars unchanged
    final = tier_states(tr["steps"], labels)[-1]
    p = setup.placement
    if not p.fits:  # the lesson's -ngl 65 on 16 GB: the GPU's allocation fails, nothing else follows
        assert [s["weights"] for s in final] == ["mapped", "failed"]
        return
    for dev, st in zip(p.devices, final):
        assert st["kv"] == ("allocated" if dev.kv_bytes else "empty"), (dev.name, st)
        assert st["buffers"] == ("allocated" if dev.compute_bytes else "empty"), (dev.name, st)
        if dev.kind == "cpu" and not dev.n_blocks and dev.weights_bytes:
            assert st["weights"] == "mapped", (dev.name, st)  # only the token embeddings: rows paged in as tokens arrive
        elif dev.weights_bytes:
            assert st["weights"] == "resident", (dev.name, st)  # copied, mapped and paged in, or read by the warm-up


def test_on_local_offers_this_machine_and_never_remembers_it():
    app = create_app(local=True)
    c = TestClient(app, base_url="http://127.0.0.1")
    cat = c.get("/api/catalog").json()
    assert cat["default_machine"] == "local" and cat["machines"][-1]["id"] == "local"
    body = {"model": "qwen2.5-0.5b", "machine": "local", "n_ctx": 2048}
    r1 = c.post("/api/fit", json=body)
    assert r1.status_code == 200 and r1.json()["machine_id"] == "local"
    c.post("/api/fit", json=body)
    assert app.state.answers.hits == 0 and app.state.answers.misses == 2
    c.post("/api/fit", json={**body, "machine": "rtx4090"})
    c.post("/api/fit", json={**body, "machine": "rtx4090"})
    assert app.state.answers.hits == 1  # a catalog machine's answer is remembered


def test_remembered_answers_are_bounded_in_bytes():
    app = create_app()
    app.state.answers.max_bytes = 60_000  # about ten calculator answers (an answer may take an eighth)
    c = TestClient(app, base_url="http://127.0.0.1")
    for n_ctx in range(1024, 1024 + 30):
        assert c.post("/api/fit", json={"model": "llama-3.1-8b", "machine": "rtx4090", "n_ctx": n_ctx}).status_code == 200
    assert 30_000 < app.state.answers.n_bytes <= 60_000


@pytest.mark.parametrize("workload,capacity,limit", [("seed-chat", 384, 8), ("seed-chat", 128, 8), ("multi-turn", 2048, 24),
                                                    ("multi-turn", 1024, 12)])
def test_kv_frames_replay_the_simulators_events(workload, capacity, limit):
    c = TestClient(create_app(), base_url="http://127.0.0.1")
    r = c.post("/api/simulate", json={"workload": workload, "capacity_tokens": capacity, "limit": limit})
    assert r.status_code == 200, r.text  # the server checks each replayed step against the simulator's counts
    d = r.json()
    for run in d["runs"]:
        a = d["animation"][run["engine"]]
        # one frame per simulator step, and one more where a step computed nothing but a request ended (rejected, truncated)
        assert a["events"][-1]["step"] == run["summary"]["steps"] and len(a["events"]) >= run["summary"]["steps"]
    blocks = d["animation"]["vllm"]["state"]
    assert blocks["kind"] == "blocks" and blocks["n_blocks"] == capacity // 16 + 1
    held = [h for f in blocks["frames"] for h, _ in f if h]
    assert held and all(isinstance(x, str) for hs in held for x in hs)
    tree = d["animation"]["sglang"]["state"]["frames"]
    if (workload, capacity) == ("seed-chat", 384):  # each second turn matches its first turn's path and locks it while it runs
        locked = {r for f in tree for n in f["nodes"] for r in n[2]}
        assert {f"user{u}-turn2" for u in range(4)} <= locked


def test_a_replay_that_loses_an_event_is_refused():
    from inferlab.errors import InvalidValueError
    from inferlab.kv.registry import manager_class
    from inferlab.kv.simulator import simulate
    from inferlab.kv.workloads import WORKLOADS
    from inferlab.web.kv_frames import sglang_frames, vllm_frames

    reqs = WORKLOADS["seed-chat"]()
    for engine, replay in (("vllm", lambda s: vllm_frames(s, 25, 16)), ("sglang", sglang_frames)):
        steps = [s.to_dict() for s in simulate(reqs, manager_class(engine)(capacity_tokens=384), record_events=True).events]
        replay(steps)  # whole: fine
        i = next(i for i, s in enumerate(steps) if any(e["kind"] == "free" for e in s["events"]))
        steps[i]["events"] = [e for e in steps[i]["events"] if e["kind"] != "free"]
        with pytest.raises(InvalidValueError, match="replay at step"):
            replay(steps)
