"""RemoveDeadPure (passes/dead_code.py): the one-scan removal against the plain fixed point.

Every call of ``remove_dead_pure`` while real kernels compile (the pass itself, Offload's and
CfgOptimize's calls on their blocks) is checked against a reference that rescans the IR until
nothing changes: the same statements are removed, the same are kept, in the same order.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.passes import cfg_optimize, dead_code, offload

N = 16


def _reference(state, labels=None) -> bool:
    """The fixed point by rescanning: drop every dead pure assignment, recount, repeat."""
    ir = state.ir
    blocks = state.func_ir.blocks
    labels = list(blocks) if labels is None else list(labels)
    removed = False
    while True:
        state.refresh_definitions()
        used = set()
        for block in blocks.values():
            for stmt in block.body:
                used.update(v.name for v in stmt.list_vars() if not (isinstance(stmt, ir.Assign) and v is stmt.target))
        progress = False
        for label in labels:
            block = blocks[label]
            keep = [s for s in block.body if not (isinstance(s, ir.Assign) and s.target.name not in used
                                                   and dead_code._is_pure(state, s.value))]
            if len(keep) != len(block.body):
                block.body = keep
                progress = removed = True
        if not progress:
            break
    state.refresh_definitions()
    return removed


def _bodies(blocks) -> dict:
    return {label: [id(stmt) for stmt in block.body] for label, block in blocks.items()}


@pytest.fixture
def checked(monkeypatch):
    """Every remove_dead_pure call compared with the reference on a copy of the blocks; returns
    the list of (removed anything, statements removed) per call."""
    calls = []
    new = dead_code.remove_dead_pure

    def compare(state, labels=None):
        original = state.func_ir.blocks
        trial = {}
        for label, block in original.items():
            trial[label] = copy.copy(block)
            trial[label].body = list(block.body)
        state.func_ir.blocks = trial
        want_removed = _reference(state, labels)
        want = _bodies(trial)
        state.func_ir.blocks = original
        before = sum(len(b.body) for b in original.values())
        got_removed = new(state, labels)
        assert (got_removed, _bodies(original)) == (want_removed, want)
        calls.append((got_removed, before - sum(len(b.body) for b in original.values())))
        return got_removed

    for module in (dead_code, offload, cfg_optimize):
        monkeypatch.setattr(module, "remove_dead_pure", compare)
    return calls


@qd.func
def twice(v):
    return 2.0 * v


@qd.func
def unused_result(v):
    w = v * 3.0     # noqa: F841  (dead after inlining)
    return v


def test_one_scan_removes_what_the_fixed_point_removes(checked, rng):
    f = qd.field(qd.f32, shape=N)
    g = qd.field(qd.f32, shape=(N, N))
    data = rng.random(N, dtype=np.float32)
    f.from_numpy(data)

    @qd.kernel
    def k(flag: qd.template(), s: qd.f32) -> qd.f32:
        total = 0.0
        for i in f:
            a = qd.static(3)
            b = a + 1                   # dead chain of user variables
            c = b * 2                   # noqa: F841
            if qd.static(flag):
                f[i] = twice(f[i]) + s
            else:
                f[i] = unused_result(f[i]) - s
        for i, j in qd.ndrange(N, (1, N)):
            x = f[i] * j
            x = x + 1.0                 # a name assigned twice
            g[i, j] = x
        for i in range(N):
            if i % 3 == 0:
                continue
            total += f[i]
        return total

    got = k(True, 0.5)
    want_f = 2.0 * data + np.float32(0.5)
    np.testing.assert_allclose(f.to_numpy(), want_f, rtol=1e-6)
    np.testing.assert_allclose(got, sum(want_f[i] for i in range(N) if i % 3), rtol=1e-5)
    expect_g = np.zeros((N, N), np.float32)
    expect_g[:, 1:] = want_f[:, None] * np.arange(1, N) + 1.0
    np.testing.assert_allclose(g.to_numpy(), expect_g, rtol=1e-6)
    k(False, 0.25)
    np.testing.assert_allclose(f.to_numpy(), want_f - np.float32(0.25), rtol=1e-6)
    assert len(checked) >= 6 and any(n > 0 for _, n in checked)


def test_a_long_dead_chain_goes_in_one_call(checked):
    f = qd.field(qd.i32, shape=N)
    lines = ["def chain():", "    for i in f:", "        x0 = i"]
    lines += [f"        x{k} = (x{k - 1}, {k})" for k in range(1, 40)]     # pure tuples, none read
    lines += ["        f[i] = i"]
    ns = {"f": f, "qd": qd}
    exec(compile("\n".join(lines) + "\n", "<chain>", "exec"), ns)
    qd.kernel(ns["chain"])()
    np.testing.assert_array_equal(f.to_numpy(), np.arange(N))
    assert max(n for _, n in checked) >= 39
