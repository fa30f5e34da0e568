"""calibrate's figures beside independent measurements of the same thing, timed here (they were
assertions in tests/hardware/test_calibrate.py; two timings are never compared inside a test: this
VM's memory speed drifts 1.5x within minutes).

    flock /tmp/inferlab-heavy.lock python benchmarks/calibrate_agreement.py [--rounds 3] [--json benchmarks/results/calibrate_agreement.json]

Read bandwidth: calibrate.read_bandwidth_gbs(2) against plain threads started at a barrier, each
taking the max of its part of a float64 array (a max streams memory; an int64 max has no AVX2
instruction and a float64 sum is pairwise, both would time the core). Interleaved rounds, so that
load from elsewhere hits both alike. Fresh memory streams slowly for the first passes on this VM
(pages not yet huge), so the independent side keeps one array for every round, after warm-up passes.
fp32 matmul: calibrate.matmul_tflops("fp32", n=512) against the median of 7 single products timed here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time


def independent_read_gbs(whole, threads: int = 2, warmup: int = 3, passes: int = 5) -> float:
    import numpy as np

    arrays = np.array_split(whole, threads)

    def one_pass() -> float:
        start = threading.Barrier(threads + 1)

        def work(a):
            start.wait()
            a.max()

        ts = [threading.Thread(target=work, args=(a,)) for a in arrays]
        for t in ts:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        return whole.nbytes / (time.perf_counter() - t0) / 1e9

    for _ in range(warmup):
        one_pass()
    return statistics.median(one_pass() for _ in range(passes))


def independent_matmul_tflops(n: int = 512, repeats: int = 7) -> float:
    import numpy as np

    a = np.ones((n, n), dtype=np.float32)
    a @ a
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e12


def main() -> None:
    import numpy as np

    from inferlab.hardware import calibrate as cal

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="benchmarks/results/calibrate_agreement.json")
    args = ap.parse_args()
    size = cal.default_working_set_bytes()
    whole = np.ones(size // 8, dtype=np.float64)
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(cal.read_bandwidth_gbs(2, size, repeats=3).median)
        theirs.append(independent_read_gbs(whole))
    mm_ours = cal.matmul_tflops("fp32", n=512, repeats=7).median
    mm_theirs = independent_matmul_tflops()
    read_ratio = statistics.median(ours) / statistics.median(theirs)
    print(f"2-thread read, GB/s: calibrate {statistics.median(ours):.2f} {['%.2f' % x for x in ours]}, "
          f"independent {statistics.median(theirs):.2f} {['%.2f' % x for x in theirs]}: ratio {read_ratio:.3f}")
    print(f"fp32 matmul n=512, TFLOP/s: calibrate {mm_ours:.3f}, independent {mm_theirs:.3f}: ratio {mm_ours / mm_theirs:.3f}")
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "working_set_bytes": size,
           "read_gbs": {"calibrate": ours, "independent": theirs, "ratio_of_medians": read_ratio},
           "matmul_fp32_tflops": {"calibrate": mm_ours, "independent": mm_theirs, "ratio": mm_ours / mm_theirs}}
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
