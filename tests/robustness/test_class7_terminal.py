"""Class 7: control characters from files never reach the terminal raw. Generated cases: a GGUF
whose general.name and a config.json whose _name_or_path hold each kind of escape (CSI colour,
OSC title and hyperlink, C1 CSI, carriage return, backspace, rich markup), through every command
that prints a model's name; the output must hold no control character but newlines and tabs, and
rich markup from the file must print as text, not style."""

from __future__ import annotations

import json
import re

import pytest

from _robust_cli import run_cli

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 1000,
         "max_position_embeddings": 2048}
ESCAPES = {"csi": "\x1b[31mRED\x1b[0m", "osc-title": "\x1b]0;pwned\x07", "osc-link": "\x1b]8;;http://x\x1b\\link",
           "c1-csi": "\x9b2J", "cr": "\rfake", "backspace": "ab\x08\x08", "bell": "\x07"}
NAME = "evil" + "".join(ESCAPES.values()) + " [bold]m[/bold]"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
COMMANDS = [["fit", "{m}", "--on", "rtx4090"], ["gguf-plan", "{m}"], ["trace", "decode", "{m}", "--on", "rtx4090"],
            ["trace", "load", "{m}", "--on", "rtx4090"], ["roofline", "--on", "rtx4090", "--model", "{m}"],
            ["capacity", "{m}", "--on", "rtx4090"], ["advise", "{m}", "--on", "rtx4090"],
            ["simulate", "--workload", "seed-chat", "--model", "{m}", "--on", "rtx4090", "--engine", "llamacpp"],
            ["fit", "{m}", "--on", "nonsense-machine"]]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    pytest.importorskip("gguf")
    from inferlab.models.gguf_writer import write_gguf
    from inferlab.models.hf_config import model_from_hf_config

    d = tmp_path_factory.mktemp("hostile")
    write_gguf(model_from_hf_config(LLAMA, name=NAME), d / "evil.gguf", dtype="F32")
    (d / "hf").mkdir()
    (d / "hf" / "config.json").write_text(json.dumps({**LLAMA, "_name_or_path": "org/" + NAME}))
    return d


# the config.json name goes through the same resolver as the GGUF's: two commands are enough for it
CASES = [("evil.gguf", c) for c in COMMANDS] + [("hf", c) for c in COMMANDS if c[0] in ("fit", "gguf-plan")]


@pytest.mark.parametrize("source,cmd", CASES, ids=[f"{s}-{' '.join(c[:2])}" for s, c in CASES])
def test_no_control_character_reaches_the_terminal(hostile, source, cmd):
    r = run_cli(*[str(hostile / source) if a == "{m}" else a for a in cmd])
    assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr, r.stderr[-500:]
    for stream in (r.stdout, r.stderr):
        bad = CONTROL.findall(stream)
        assert not bad, (sorted(set(bad)), stream[:300])
    if r.returncode == 0 and cmd[0] in ("fit", "gguf-plan"):
        assert "evil" in r.stdout and "[bold]m[/bold]" in r.stdout  # the name is shown, markup as text


def test_strip_control_keeps_text_drops_escapes():
    from inferlab.cli.common import safe, strip_control

    for kind, esc in ESCAPES.items():
        out = strip_control(f"a{esc}b\n\tc")
        assert not CONTROL.search(out) and out.startswith("a") and out.endswith("b\n\tc"), kind
    assert safe("[red]x[/red]") == "\\[red]x\\[/red]"  # rich markup escaped, printed as typed
