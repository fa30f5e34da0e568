"""The JSON API over real HTTP on loopback: every refusal is a 4xx with a JSON message naming the
problem; a client cannot make the server open a path; no CORS; the Host header is checked; model
files named on the command line are offered by id and answer like `inferlab fit FILE --json`."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

FIT = {"model": "llama-3.1-8b", "machine": "rtx4090"}


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server, timeout=30) as c:
        yield c


def refused(r: httpx.Response, status: int, *words: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    msg = r.json()["error"]
    for w in words:
        assert w in msg, msg
    return msg


@pytest.mark.parametrize("path,body,status,words", [
    # unknown names, with what would be valid
    ("/api/fit", {**FIT, "model": "llama-9"}, 400, ["unknown model 'llama-9'", "llama-3.1-8b"]),
    ("/api/fit", {**FIT, "machine": "rtx9090"}, 400, ["unknown machine 'rtx9090'", "rtx4090"]),
    ("/api/fit", {**FIT, "quant": "Q9_K"}, 400, ["Q9_K", "Q4_K_M"]),
    ("/api/fit", {**FIT, "kv_type": "f12"}, 400, ["f12"]),
    ("/api/fit", {**FIT, "speed": "fast"}, 422, ["speed", "calibrated"]),
    ("/api/simulate", {"workload": "chat-9"}, 422, ["workload"]),
    ("/api/simulate", {"engines": ["tgi"]}, 422, ["engines.0"]),
    # paths are never opened: a path is just an unknown name
    ("/api/fit", {**FIT, "model": "/etc/passwd"}, 400, ["unknown model '/etc/passwd'"]),
    ("/api/fit", {**FIT, "model": "../../models/x.gguf"}, 400, ["unknown model"]),
    ("/api/fit", {**FIT, "machine": "local"}, 400, ["unknown machine 'local'"]),  # only with `serve --on local`
    # out of range
    ("/api/fit", {**FIT, "n_ctx": 0}, 422, ["n_ctx", "greater than or equal to 1"]),
    ("/api/fit", {**FIT, "n_ctx": 10**12}, 422, ["n_ctx", "less than or equal to"]),
    ("/api/fit", {**FIT, "n_gpu_layers": -1}, 422, ["n_gpu_layers"]),
    ("/api/trace/decode", {**FIT, "n_ctx": 8192, "context": 9000}, 400, ["9000", "8192"]),
    ("/api/trace/phases", {**FIT, "n_ctx": 4096, "n_prompt": 5000}, 400, ["5000", "4096"]),
    ("/api/roofline", {**FIT, "batch": 0}, 422, ["batch"]),
    ("/api/simulate", {"capacity_tokens": 1}, 422, ["capacity_tokens"]),
    ("/api/simulate", {"limit": 100000}, 422, ["limit"]),
    ("/api/trace/load", {**FIT, "disk_gbps": 0}, 422, ["disk_gbps"]),
    # wrong types
    ("/api/fit", {**FIT, "n_ctx": "8192"}, 422, ["n_ctx", "valid integer"]),
    ("/api/fit", {**FIT, "n_ctx": 8192.5}, 422, ["n_ctx"]),
    ("/api/fit", {**FIT, "n_ctx": True}, 422, ["n_ctx"]),
    ("/api/fit", {**FIT, "model": 7}, 422, ["model"]),
    ("/api/fit", {**FIT, "quant": ["Q4_K_M"]}, 422, ["quant"]),
    ("/api/fit", [FIT], 422, []),
    ("/api/fit", {**FIT, "extra": 1}, 422, ["extra", "not permitted"]),
    ("/api/fit", {"model": "llama-3.1-8b"}, 422, ["machine", "required"]),
])
def test_bad_input_is_a_4xx_with_a_message(client, path, body, status, words):
    refused(client.post(path, json=body), status, *words)


@pytest.mark.parametrize("raw", [b'{"model": "llama-3.1-8b", "machine": "rtx4090", "n_ctx": NaN}',
                                 b'{"model": "llama-3.1-8b", "machine": "rtx4090", "n_ctx": Infinity}',
                                 b'{"model": "llama-3.1-8b", "machine": "rtx4090", "n_ctx": -Infinity}'])
def test_non_finite_numbers_are_refused(client, raw):
    refused(client.post("/api/fit", content=raw, headers={"content-type": "application/json"}), 422, "n_ctx")


def test_non_finite_float_field_is_refused(client):
    raw = b'{"model": "llama-3.1-8b", "machine": "rtx4090", "disk_gbps": NaN}'
    refused(client.post("/api/trace/load", content=raw, headers={"content-type": "application/json"}), 422, "disk_gbps", "finite")


def test_oversized_and_malformed_bodies(client):
    big = json.dumps({**FIT, "quant": "Q4_K_M", "pad": "x" * 20_000}).encode()
    refused(client.post("/api/fit", content=big, headers={"content-type": "application/json"}), 413, "over the limit of 16384 bytes")

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(40):
            yield b" " * 1000

    refused(client.post("/api/fit", content=chunks(), headers={"content-type": "application/json"}), 413, "over the limit")
    refused(client.post("/api/fit", content=b"{not json", headers={"content-type": "application/json"}), 422, "not valid JSON")
    refused(client.get("/api/fit"), 405, "GET is not allowed")
    refused(client.post("/api/nothing", json={}), 404, "no such endpoint")


def test_no_cors(client):
    origin = {"Origin": "http://evil.example"}
    r = client.post("/api/fit", json=FIT, headers=origin)
    assert r.status_code == 200 and not any(h.lower().startswith("access-control-") for h in r.headers)
    pre = client.options("/api/fit", headers={**origin, "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 405 and "access-control-allow-origin" not in pre.headers


def test_the_page_may_load_only_from_this_server(client):
    csp = client.get("/").headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert client.get("/api/catalog").headers["x-content-type-options"] == "nosniff"


def test_host_header_must_be_loopback(client):
    r = client.get("/api/catalog", headers={"Host": "evil.example"})  # DNS rebinding: a foreign name for 127.0.0.1
    assert r.status_code == 400
    assert client.get("/api/catalog", headers={"Host": "localhost"}).status_code == 200


def test_fit_equals_the_cli_json_and_says_where_numbers_come_from(client):
    d = client.post("/api/fit", json={**FIT, "n_ctx": 8192}).json()
    cli = subprocess.run([sys.executable, "-m", "inferlab.cli.main", "fit", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "8192", "--json"],
                         capture_output=True, text=True, timeout=60)
    want = json.loads(cli.stdout)
    assert {k: v for k, v in d.items() if k not in ("provenance", "commands")} == want
    prov = d["provenance"]
    assert prov["decode"]["origin"] == "estimated" and "calibrated" in prov["decode"]["source"]
    assert prov["devices.capacity_bytes"]["origin"] == "catalog" and "nvidia.com" in prov["devices.capacity_bytes"]["source"]
    assert {f["origin"] for f in d["figures"]} <= {"catalog", "file", "calibrated", "measured", "estimated", "assumed"}


def test_a_model_file_from_the_command_line_is_offered_by_id(client, toy_gguf):
    models = {m["id"]: m for m in client.get("/api/catalog").json()["models"]}
    mine = models["file:toy-dense.gguf"]
    assert mine["origin"] == "file" and mine["n_layers"] == 4 and mine["own_tensors"]
    d = client.post("/api/fit", json={"model": "file:toy-dense.gguf", "machine": "rtx4090"}).json()
    cli = subprocess.run([sys.executable, "-m", "inferlab.cli.main", "fit", str(toy_gguf), "--on", "rtx4090", "--json"],
                         capture_output=True, text=True, timeout=60)
    want = json.loads(cli.stdout)
    for k in ("weights_bytes", "n_gpu_layers", "n_ctx", "fits", "quant"):
        assert d[k] == want[k], k
    assert d["decode"]["tok_per_s"] == want["decode"]["tok_per_s"]
    assert d["provenance"]["weights_bytes"]["origin"] == "file"  # the file's own tensors


def test_simulate_equals_the_cli_json(client):
    d = client.post("/api/simulate", json={"workload": "multi-turn", "capacity_tokens": 4096, "limit": 24}).json()
    cli = subprocess.run([sys.executable, "-m", "inferlab.cli.main", "simulate", "--workload", "multi-turn", "--capacity-tokens", "4096",
                          "--limit", "24", "--json"], capture_output=True, text=True, timeout=120)
    want = json.loads(cli.stdout)
    assert [r["summary"] for r in d["runs"]] == [r["summary"] for r in want["runs"]]
    assert set(d["animation"]) == {"llamacpp", "vllm", "sglang"}
