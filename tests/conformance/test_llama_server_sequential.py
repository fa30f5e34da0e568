"""SlotManager against a real llama-server, request by request (issue 17, llama.cpp part).

For each case a llama-server built from the llama.cpp tree that llama-cpp-python vendors runs a
tiny random-weight GGUF with the case's flags; the requests go one at a time (each after the
previous answered) to /completion. Per request the slot it got (``id_slot``), the prompt tokens
it reused (``timings.cache_n``), its outcome (finished, truncated at the slot context, or the
error) and the number of tokens generated, and after it what every slot holds (``/slots``
``n_prompt_tokens``), must equal SlotManager's on the same requests. The replies are the
server's own greedy tokens, fed to the simulator as the requests' outputs. The hand-made cases
each exercise a rule; four seeded random mixes (new prompts, shared system prompts, follow-ups,
repeats, edited histories, prompts near the slot size) exercise them together.

The server binary comes from scripts/build_llama_server.sh (scripts/test builds it first; cached
under ~/.cache/inferlab/); this test does not skip when it is missing, it builds it.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llama_server import LlamaServer, compare, run_sequential, simulate_sequential  # noqa: E402
from _llama_server_cases import SEQUENTIAL, SEQUENTIAL_RANDOM  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]



@pytest.mark.parametrize("case", SEQUENTIAL + SEQUENTIAL_RANDOM, ids=[c.name for c in SEQUENTIAL + SEQUENTIAL_RANDOM])
def test_sequential_requests_agree_with_the_real_server(case, binary, model, tmp_path):
    with LlamaServer(binary, model, list(case.server_args), tmp_path / "server.log", verbose=True) as srv:
        prompts, replies, seen = run_sequential(srv, case)
        log = srv.log_text()
    sim = simulate_sequential(case, prompts, replies)
    diffs = compare(seen, sim)
    assert not diffs, f"{case.name} ({case.why}):\n" + "\n".join(diffs)
    # the case did what it is for: no request failed in an unexpected way
    assert all(o.outcome in ("ok", "truncated", "too-long") for o in seen), [o.detail for o in seen]
    missing = [line for line in case.expect_log if line not in log]
    assert not missing, f"{case.name}: the server never logged {missing}"
