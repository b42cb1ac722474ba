"""qd.init options and QD_* variables (qd_numba/config.py, runtime.py; docs/configuration.md)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config


@pytest.fixture
def reinit(arch):
    """qd.init on the test's arch; the module's configuration is restored afterwards."""
    yield lambda **options: qd.init(arch=getattr(qd, arch), **options)
    qd.init(arch=getattr(qd, arch))


def test_unknown_option_is_our_error_naming_it(reinit):
    with pytest.raises(qd.QuadrantsConfigError, match="unknown option 'foo'"):
        reinit(foo=1)
    assert issubclass(qd.QuadrantsConfigError, qd.QuadrantsError)
    assert issubclass(qd.QuadrantsConfigError, TypeError)     # as Python's own keyword errors


@pytest.mark.parametrize("variable, value", [
    ("QD_DEBUG", "maybe"), ("QD_KERNEL_FUSION_BUDGET", "many"), ("QD_LOG_LEVEL", "loud"),
])
def test_invalid_variable_is_our_error_naming_it(reinit, monkeypatch, variable, value):   # monkeypatch undone first
    monkeypatch.setenv(variable, value)
    with pytest.raises(qd.QuadrantsConfigError, match=f"{variable}='{value}'"):
        reinit()
    with pytest.raises(ValueError):     # an invalid value is also a ValueError
        config.config_from_env()


def test_invalid_arch_variable_names_it(monkeypatch):
    monkeypatch.setenv("QD_ARCH", "tpu")
    try:
        with pytest.raises(qd.QuadrantsRuntimeError, match="QD_ARCH: unsupported arch 'tpu'"):
            qd.init()
    finally:
        monkeypatch.delenv("QD_ARCH")
        qd.init()


def test_thread_limit_lasts_until_the_next_init(reinit, arch):
    if arch != "cpu":
        pytest.skip("CPU thread counts")
    reinit(cpu_max_num_threads=1)
    assert numba.get_num_threads() == 1
    reinit()
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS


def test_int_division_follows_default_fp_set_after_first_compile(reinit, rng):
    @qd.kernel
    def divide(out: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.i32, ndim=1), c: int):
        for i in range(out.shape[0]):
            out[i] = b[i] / c

    b = rng.integers(1, 1000, 16).astype(np.int32)
    out = np.zeros(16)
    reinit(default_fp=qd.f32)
    divide(out, b, 7)
    np.testing.assert_array_equal(out, (b.astype(np.float32) / np.float32(7)).astype(np.float64))
    reinit(default_fp=qd.f64)        # the same kernel, and the same int / int typing, again
    divide(out, b, 7)
    np.testing.assert_array_equal(out, b / 7.0)


def test_every_option_and_variable_is_documented_in_one_place():
    """docs/configuration.md has a row for every ``qd.init`` option (its first column) and names
    every ``QD_*`` variable the package reads."""
    import dataclasses
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "configuration.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_0-9]+)`", doc, re.M))
    internal = {"quadrants_options"}    # where the accepted Quadrants options without effect are kept
    options = {f.name for f in dataclasses.fields(config.Config)} - internal
    assert sorted(options - rows) == []
    source = "".join(p.read_text() for p in (root / "qd_numba").rglob("*.py"))
    variables = set(re.findall(r"\bQD_[A-Z0-9_]+\b", source))
    assert len(variables) > 20 and sorted(v for v in variables if v not in doc) == []
