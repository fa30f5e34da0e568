"""A real llama-server for the conformance tests, and the same workload through SlotManager.

``server_binary()`` builds (or finds cached) ``llama-server`` with scripts/build_llama_server.sh;
``tiny_gguf()`` writes a random-weight llama GGUF with inferlab's writer; ``LlamaServer`` starts
the server on 127.0.0.1 and a free port, sends token-id prompts to ``/completion`` (greedy,
``ignore_eos``, ``return_tokens``) and reads ``/slots``; it is always killed on exit.

``run_sequential`` sends a case's requests one at a time (each prompt may repeat earlier
replies) and records, per request: the slot (``id_slot``), the reused prompt tokens
(``timings.cache_n``), the outcome, and every slot's token count from ``/slots`` afterwards.
``simulate_sequential`` serves the same requests (the server's replies as their outputs) with
``SlotManager`` and reads the same figures, one prefix of the workload at a time.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build_llama_server.sh"
REQUEST_TIMEOUT_S = 60
START_TIMEOUT_S = 90

# The tiny model: 4 llama layers, 4 KV heads of 64, f16 cache -> K + V = 4 x 2 x 256 x 2 B = 4,096 B
# per token, so a 1 MiB RAM cache holds about 255 tokens of state.
TINY = dict(n_layers=4, d_model=256, n_heads=4, n_kv_heads=4, head_dim=64, d_ff=512, vocab_size=512)
TINY_KV_BYTES_PER_TOKEN = TINY["n_layers"] * 2 * TINY["n_kv_heads"] * TINY["head_dim"] * 2
TINY_N_CTX_TRAIN = 32768
FIRST_ID = 3  # token ids 0-2 are <unk>, <s>, </s>
FILLER_ID = 3


def server_binary() -> Path:
    """The llama-server binary: $INFERLAB_LLAMA_SERVER, else built/cached by the build script."""
    env = os.environ.get("INFERLAB_LLAMA_SERVER")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True, timeout=3600)
    return Path(out.stdout.strip().splitlines()[-1])


def build_info(binary: Path) -> dict:
    info = binary.parent / "build.json"
    return json.loads(info.read_text()) if info.exists() else {}


def tiny_gguf(path: Path) -> Path:
    from inferlab.models.gguf_writer import write_gguf
    from inferlab.models.spec import ModelSpec

    spec = ModelSpec(name="conformance-tiny", arch="llama", n_ctx_train=TINY_N_CTX_TRAIN, **TINY)
    return write_gguf(spec, path, dtype="F16", seed=7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(Exception):
    def __init__(self, status: int, body: dict):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body

    @property
    def message(self) -> str:
        err = self.body.get("error", {})
        return err.get("message", "") if isinstance(err, dict) else str(err)


class LlamaServer:
    """``llama-server -m MODEL ARGS`` on 127.0.0.1:<free port>; a context manager that kills it."""

    def __init__(self, binary: Path, model: Path, args: list[str], log_path: Path, *, verbose: bool = False):
        self.binary, self.model, self.args, self.log_path = binary, model, args, log_path
        self.verbose = verbose  # -v: debug lines, one "posting NEXT_RESPONSE" per update_slots
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        self._log = open(self.log_path, "w")
        cmd = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", "2", "-tb", "2", "--no-warmup", "-fit", "off", "--threads-http", "8", *(["-v"] if self.verbose else []), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if self._get("/health", timeout=2).get("status") == "ok":
                    return self
            except (OSError, ServerError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not become ready in {START_TIMEOUT_S} s: {self.log_tail()}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 3000) -> str:
        return self.log_text()[-n:]

    def _get(self, path: str, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ServerError(e.code, _json_or_text(e.read())) from None

    def _post(self, path: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ServerError(e.code, _json_or_text(e.read())) from None

    def complete(self, prompt: list[int], n_predict: int, **extra) -> dict:
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
                "return_tokens": True, "stream": False, **extra}
        return self._post("/completion", body)

    def slots(self) -> list[dict]:
        return self._get("/slots")


def _json_or_text(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": {"message": raw.decode(errors="replace")}}


# ---------------------------------------------------------------------------------------------
# workloads


@dataclass(frozen=True)
class Turn:
    """One request: its prompt as parts, each a token list or ("reply", k) = request k's reply."""

    parts: tuple
    n_predict: int


@dataclass(frozen=True)
class Case:
    name: str
    server_args: tuple[str, ...]  # llama-server flags (besides -m, host, port, threads)
    manager_kwargs: dict  # the same configuration for SlotManager
    turns: tuple[Turn, ...]
    why: str = ""  # what the case exercises
    expect_log: tuple[str, ...] = ()  # server log lines that show the rule was exercised


@dataclass
class Observed:
    """What one request got: from the server or from the simulator."""

    id_slot: int | None
    cache_n: int | None
    outcome: str  # "ok", "truncated", "too-long", "exceeded"
    n_generated: int
    slots: tuple[int, ...] = ()  # tokens held by each slot after the request
    detail: str = ""


def segment(seed: int, n: int, vocab: int = TINY["vocab_size"]) -> list[int]:
    """n pseudo-random token ids in [FIRST_ID, vocab), reproducible from seed."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(FIRST_ID, vocab) for _ in range(n)]


def build_prompt(turn: Turn, replies: list[list[int]], prompts: list[list[int]]) -> list[int]:
    out: list[int] = []
    for p in turn.parts:
        if isinstance(p, tuple) and p[0] == "reply":
            out += replies[p[1]]
        elif isinstance(p, tuple) and p[0] == "prompt":
            out += prompts[p[1]]
        else:
            out += list(p)
    return out


def _outcome_of_error(message: str) -> str:
    if "exceeds the available context size" in message:
        return "too-long"
    if "Context size has been exceeded" in message:
        return "exceeded"
    return "error: " + message


def run_sequential(server: LlamaServer, case: Case) -> tuple[list[list[int]], list[list[int]], list[Observed]]:
    """Send the case's requests one by one; return prompts, replies and what each got."""
    prompts: list[list[int]] = []
    replies: list[list[int]] = []
    seen: list[Observed] = []
    for turn in case.turns:
        prompt = build_prompt(turn, replies, prompts)
        try:
            r = server.complete(prompt, turn.n_predict)
            toks = list(r["tokens"])
            outcome = "truncated" if r.get("truncated") else "ok"
            obs = Observed(r["id_slot"], r["timings"]["cache_n"], outcome, len(toks))
        except ServerError as e:
            toks = []
            obs = Observed(None, None, _outcome_of_error(e.message), 0, detail=e.message)
        slots = sorted(server.slots(), key=lambda s: s["id"])
        obs.slots = tuple(s.get("n_prompt_tokens", 0) for s in slots)
        prompts.append(prompt)
        replies.append(toks)
        seen.append(obs)
    return prompts, replies, seen


def requests_of(case: Case, prompts: list[list[int]], replies: list[list[int]], *, spacing_s: float = 1e6,
                arrivals: list[float] | None = None):
    from inferlab.kv_managers import Request

    reqs = []
    for k, (turn, prompt, reply) in enumerate(zip(case.turns, prompts, replies)):
        out = (list(reply) + [FILLER_ID] * turn.n_predict)[: turn.n_predict]
        t = arrivals[k] if arrivals is not None else k * spacing_s
        reqs.append(Request(k, t, prompt, turn.n_predict, output=out))
    return reqs


def manager_for(case):
    from inferlab.kv.slots import SlotManager

    kw = dict(kv_bytes_per_token=TINY_KV_BYTES_PER_TOKEN, n_layers=TINY["n_layers"], n_ctx_train=TINY_N_CTX_TRAIN)
    kw.update(case.manager_kwargs)
    return SlotManager(**kw)


def _observed_from(rec, manager) -> Observed:
    if rec.rejected is not None:
        outcome = _outcome_of_error(rec.rejected)
        return Observed(None, None, outcome, 0)
    return Observed(manager.slot_of(rec.id), rec.cached_tokens, "truncated" if rec.truncated else "ok",
                    rec.output_tokens)


def simulate_sequential(case: Case, prompts, replies) -> list[Observed]:
    """SlotManager on the same requests: per request its figures and the slots after it."""
    from inferlab.kv_managers import simulate

    reqs = requests_of(case, prompts, replies)
    out: list[Observed] = []
    for k in range(1, len(reqs) + 1):  # slots after request k: run the first k requests
        m = manager_for(case)
        run = simulate(reqs[:k], m, check_invariants=True, record_timeline=False)
        obs = _observed_from(run.requests[k - 1], m)
        obs.slots = tuple(s.n_tokens for s in m.slots)
        out.append(obs)
    return out


def compare(server_obs: list[Observed], sim_obs: list[Observed]) -> list[str]:
    """Differences, one line per request and field (empty: full agreement)."""
    diffs = []
    for k, (a, b) in enumerate(zip(server_obs, sim_obs)):
        for fld in ("id_slot", "cache_n", "outcome", "n_generated", "slots"):
            va, vb = getattr(a, fld), getattr(b, fld)
            if fld == "id_slot" and a.outcome in ("too-long", "exceeded"):
                continue  # the error response names no slot; /slots and later requests show it
            if va != vb:
                diffs.append(f"request {k}: {fld} server={va} simulator={vb}")
    return diffs


# ---------------------------------------------------------------------------------------------
# concurrent groups


@dataclass(frozen=True)
class ConcurrentCase:
    """Groups of requests; the requests of a group are sent at once, the groups one after another."""

    name: str
    server_args: tuple[str, ...]
    manager_kwargs: dict
    groups: tuple[tuple[Turn, ...], ...]
    why: str = ""


_LAUNCH = re.compile(r"slot launch_slot_: id +(\d+) \| task (\d+) \| processing task")
_DEFER = re.compile(r"no slot is available, defer task, id_task = (\d+)")
_PROMPT = re.compile(r"id +\d+ \| task (\d+) \| new prompt, n_ctx_slot = \d+, n_keep = -?\d+, task.n_tokens = (\d+)")
_EXCEEDED_AT_0 = re.compile(r"Context size has been exceeded\. off = 0,")


@dataclass
class TaskTrace:
    task: int
    slot: int | None = None
    n_tokens: int | None = None
    received_iter: float | None = None  # update_slots iterations (that decode) before it was taken
    order: int | None = None  # log line where it was taken (launched or deferred): queue order


def parse_log(log: str) -> dict[int, TaskTrace]:
    """Per completion task: the slot it was launched in, its prompt length and the number of
    update_slots iterations the server had run (ones that decoded something) when it took the
    task from its queue (launched or deferred). Needs the server's -v log."""
    tasks: dict[int, TaskTrace] = {}
    iters, after_empty = 0, 0.0
    for i, line in enumerate(log.splitlines()):
        if "posting NEXT_RESPONSE" in line:
            iters, after_empty = iters + 1, 0.0
        elif _EXCEEDED_AT_0.search(line):
            # that iteration decoded nothing: the simulator spends no time on it, so a task taken
            # after it arrives half a step later (not before it, at the same instant)
            iters, after_empty = iters - 1, 0.5
        elif m := _LAUNCH.search(line):
            t = tasks.setdefault(int(m[2]), TaskTrace(int(m[2])))
            t.slot = int(m[1])
            if t.received_iter is None:
                t.received_iter, t.order = iters + after_empty, i
        elif m := _DEFER.search(line):
            t = tasks.setdefault(int(m[1]), TaskTrace(int(m[1])))
            if t.received_iter is None:
                t.received_iter, t.order = iters + after_empty, i
        elif m := _PROMPT.search(line):
            tasks.setdefault(int(m[1]), TaskTrace(int(m[1]))).n_tokens = int(m[2])
    return tasks


def run_concurrent(server: LlamaServer, case: ConcurrentCase):
    """Send each group at once (one thread per request); return the turns in order, prompts,
    replies, what each got, and the slots after each group."""
    from concurrent.futures import ThreadPoolExecutor

    turns = [t for g in case.groups for t in g]
    prompts: list[list[int]] = []
    replies: list[list[int]] = []
    seen: list[Observed] = []
    group_slots = []
    for group in case.groups:
        gp = [build_prompt(t, replies, prompts) for t in group]
        with ThreadPoolExecutor(len(group)) as ex:
            futs = [ex.submit(server.complete, p, t.n_predict) for p, t in zip(gp, group)]
            for p, f in zip(gp, futs):
                try:
                    r = f.result()
                    toks = list(r["tokens"])
                    seen.append(Observed(r["id_slot"], r["timings"]["cache_n"],
                                         "truncated" if r.get("truncated") else "ok", len(toks)))
                except ServerError as e:
                    toks = []
                    seen.append(Observed(None, None, _outcome_of_error(e.message), 0, detail=e.message))
                prompts.append(p)
                replies.append(toks)
        group_slots.append(tuple(s.get("n_prompt_tokens", 0) for s in sorted(server.slots(), key=lambda s: s["id"])))
    return turns, prompts, replies, seen, group_slots


def simulate_concurrent(case: ConcurrentCase, prompts, replies, trace: dict[int, TaskTrace], *, as_received: bool):
    """SlotManager on the same requests. Requests are matched to the server's tasks by prompt
    length (unique in a case). as_received: each arrives at the update_slots iteration the
    server took it in; else all of a group arrive at one instant, in the server's order."""
    from inferlab.kv_managers import Request, simulate

    if len({len(p) for p in prompts}) != len(prompts):
        raise ValueError(f"{case.name}: prompt lengths must be unique to match the server's tasks")
    by_len = {t.n_tokens: t for t in trace.values() if t.n_tokens is not None}
    sizes = [len(g) for g in case.groups]
    reqs, k = [], 0
    for g, n in enumerate(sizes):
        for _ in range(n):
            t = by_len[len(prompts[k])]
            turn = [x for gg in case.groups for x in gg][k]
            out = (list(replies[k]) + [FILLER_ID] * turn.n_predict)[: turn.n_predict]
            arrival = float(t.received_iter) if as_received else g * 1e6
            # task ids are taken before the task is queued: two HTTP threads may queue them in the
            # other order, so the order is the server's (the log line where it took each task)
            reqs.append((arrival, t.order, Request(k, arrival, prompts[k], turn.n_predict, output=out)))
            k += 1
    reqs.sort(key=lambda x: (x[0], x[1]))
    ordered = [r for _, _, r in reqs]
    m = manager_for(case)
    run = simulate(ordered, m, check_invariants=True, record_timeline=False)
    recs = {r.id: r for r in run.requests}
    out = []
    for k in range(len(prompts)):
        rec = recs[k]
        o = _observed_from(rec, m)
        o.id_slot = m.slot_of(k)
        out.append(o)
    return out, tuple(s.n_tokens for s in m.slots)


def compare_concurrent(seen: list[Observed], trace: dict[int, TaskTrace], prompts, sim: list[Observed]) -> list[str]:
    by_len = {t.n_tokens: t for t in trace.values() if t.n_tokens is not None}
    diffs = []
    for k, (a, b) in enumerate(zip(seen, sim)):
        slot = by_len[len(prompts[k])].slot  # the log names the slot of failed requests too
        for fld, va, vb in (("id_slot", slot, b.id_slot), ("cache_n", a.cache_n, b.cache_n),
                            ("outcome", a.outcome, b.outcome), ("n_generated", a.n_generated, b.n_generated)):
            if va != vb:
                diffs.append(f"request {k}: {fld} server={va} simulator={vb}")
    return diffs
