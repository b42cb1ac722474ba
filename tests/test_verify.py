"""The IR verifier (passes/verify.py): it accepts what the pipeline produces and names the
pass when an invariant is broken."""

from __future__ import annotations

import numpy as np
import pytest
from numba.core import types

import qd_numba as qd
from qd_numba.errors import QuadrantsCompilationError
from qd_numba.passes.base import CompileState, IRTools, copy_ir
from qd_numba.passes.pipeline import run_untyped_pipeline
from qd_numba.passes.verify import verify_final, verify_ir

x = qd.field(qd.f32, shape=16)


@qd.kernel
def two_loops(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    t = s * 2.0
    for i in range(a.shape[0]):
        a[i] = a[i] * t
    for i in x:
        x[i] = x[i] + t


def _state(kernel=two_loops):
    tools = IRTools.for_cpu()
    param_types = {"a": types.Array(types.float32, 1, "C"), "s": types.float32}
    state = CompileState(tools=tools, func_ir=copy_ir(tools.ir, kernel.frontend_ir(tools)),
                         kernel_name=kernel.name, config=qd.config.current.for_kernel(fuse=None, graph=False),
                         runtime_params=["a", "s"], param_types=param_types, template_values={},
                         kernel_qualname=kernel.qualname)
    run_untyped_pipeline(state)
    return state


def test_pipeline_output_verifies(rng):
    state = _state()
    verify_final(state, "test")
    assert [t.kind for t in state.tasks] == ["range_for", "range_for"]  # t = s * 2.0 is pure: no serial task
    a = rng.standard_normal(8).astype(np.float32)  # the kernel itself still runs correctly
    ref = a * np.float32(3.0)
    two_loops(a, 1.5)
    np.testing.assert_allclose(a, ref, rtol=1e-6)


def test_dangling_variable_names_the_pass():
    state = _state()
    ir = state.ir
    for block in state.func_ir.blocks.values():   # drop the definition of the serial value t
        block.body = [s for s in block.body if not (isinstance(s, ir.Assign) and s.target.name == "t")]
    with pytest.raises(QuadrantsCompilationError, match=r"after broken_pass: variable 't' is read but never assigned"):
        verify_final(state, "broken_pass")


def test_missing_jump_target_names_the_pass():
    state = _state()
    ir = state.ir
    label, block = next((lbl, b) for lbl, b in state.func_ir.blocks.items() if isinstance(b.body[-1], ir.Jump))
    block.body[-1] = ir.Jump(10**6, block.body[-1].loc)
    with pytest.raises(QuadrantsCompilationError, match=rf"after broken_pass: block {label} jumps to 1000000"):
        verify_ir(state, "broken_pass")


def test_overlapping_task_bodies_are_caught():
    state = _state()
    first, second = state.loops
    second.body = second.body | {first.header}
    with pytest.raises(QuadrantsCompilationError, match="shares body blocks"):
        verify_final(state, "broken_pass")


def test_task_without_loop_is_caught():
    state = _state()
    state.loops.pop()
    with pytest.raises(QuadrantsCompilationError, match="one to one"):
        verify_final(state, "broken_pass")
