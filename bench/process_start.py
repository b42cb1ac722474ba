"""What a fresh process pays before its kernels run on CUDA: ``import qd_numba``, ``qd.init``,
the first kernel's call (its compile, Numba's and numba-cuda's one-time set-up, the launch and a
sync) and a second kernel's. Run it as its own process, with a tree first on ``PYTHONPATH`` to
compare trees; prints one JSON object (milliseconds; ``first_stages``: the first kernel's
compile record by stage, empty on an offline-cache hit). Needs a GPU.

    python3 bench/process_start.py                  # offline cache off: every kernel compiles
    python3 bench/process_start.py --cache-dir D    # run twice: the second process finds D's kernels

bench/results/session12.md has before/after runs.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

import qd_numba as qd  # noqa: E402

T1 = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    t = time.perf_counter()
    if args.cache_dir:
        qd.init(arch=qd.cuda, offline_cache=True, offline_cache_file_path=args.cache_dir)
    else:
        qd.init(arch=qd.cuda, offline_cache=False)
    init = time.perf_counter() - t
    n = 1 << 16
    a, b = qd.field(qd.f32, shape=n), qd.field(qd.f32, shape=n)
    a.from_numpy(np.random.default_rng(0).random(n, dtype=np.float32))
    qd.sync()

    @qd.kernel
    def first():
        for i in a:
            b[i] = a[i] * 1.5 + 0.25

    @qd.kernel
    def second():
        for i in a:
            b[i] = a[i] * 2.5 + 0.5

    from qd_numba import profiler

    records = len(profiler._compile_records)
    t = time.perf_counter()
    first()
    qd.sync()
    first_ms = (time.perf_counter() - t) * 1e3
    stages = {}
    if len(profiler._compile_records) > records:
        stages = {k: round(v * 1e3, 1) for k, v in profiler._compile_records[records].stages.items() if v > 0}
    t = time.perf_counter()
    second()
    qd.sync()
    second_ms = (time.perf_counter() - t) * 1e3
    expected = a.to_numpy() * np.float32(2.5) + np.float32(0.5)
    assert np.allclose(b.to_numpy(), expected, rtol=1e-6), "wrong result"
    print(json.dumps({"import_ms": (T1 - T0) * 1e3, "init_ms": init * 1e3, "first_kernel_ms": first_ms,
                      "first_stages": stages, "second_kernel_ms": second_ms}))


if __name__ == "__main__":
    main()
