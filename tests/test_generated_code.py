"""Generated Python (call paths, launch runners) shows its source in tracebacks and dumps."""

from __future__ import annotations

import linecache
import traceback

import numpy as np

import qd_numba as qd
from qd_numba import config
from qd_numba.generated_code import exec_generated


def test_generated_source_is_in_linecache_and_tracebacks():
    ns = exec_generated("def boom(x):\n    return 1 // x\n", "test boom", {})
    try:
        ns["boom"](0)
    except ZeroDivisionError as e:
        frames = traceback.extract_tb(e.__traceback__)
    else:
        raise AssertionError("1 // 0 did not raise")
    last = frames[-1]
    assert last.filename.startswith("<qd_numba test boom #")
    assert last.line == "return 1 // x"
    assert linecache.getline(last.filename, 1).startswith("def boom(x):")


def test_kernel_call_path_is_readable(rng):
    @qd.kernel
    def add(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
        for i in range(a.shape[0]):
            a[i] += s

    a = rng.random(16).astype(np.float32)
    expected = a + 2.0
    add(a, 2.0)
    np.testing.assert_allclose(a, expected, rtol=1e-6)
    code = type(add).__call__.__code__
    assert code.co_filename.startswith("<qd_numba call ")
    source = "".join(linecache.getlines(code.co_filename))
    assert "def __call__(__qd_self, a=MISSING, s=MISSING" in source


def test_dump_generated_prints_the_source(capsys):
    saved = config.current.dump_generated
    config.current.dump_generated = True
    try:
        exec_generated("def f():\n    return 42\n", "test dump", {})
    finally:
        config.current.dump_generated = saved
    err = capsys.readouterr().err
    assert "=== qd_numba generated source <qd_numba test dump #" in err and "return 42" in err
