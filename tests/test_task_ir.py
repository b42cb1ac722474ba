"""The task cutter (passes/task_ir.py) and typed Tasks (passes/task_types.py), on both targets:
cutting is linear in the kernel's size and runs no whole-kernel analysis per task; every Task
carries the types of its variables, equal to what each target lowers."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from numba.core import compiler, types
from numba.core.registry import cpu_target

import qd_numba as qd
from qd_numba.frontend.args import field_type
from qd_numba.passes.base import IRTools
from qd_numba.passes.task_ir import CUT_COUNTS, cut_task
from qd_numba.passes.task_types import type_tasks
from qd_numba.targets import cpu
from qd_numba.targets.base import target_for
from qd_numba.targets.cuda.compile import numba_cuda_importable
from qd_numba.targets.untyped import untyped_compile

needs_cuda = pytest.mark.skipif(not numba_cuda_importable(), reason="needs numba-cuda")


def _k_loop_kernel(k: int):
    """A kernel of ``k`` top-level loops, each a few float ops on its own pair of fields (the
    compile-time benchmark's shape), with a value from serial code between loops."""
    fields = [(qd.field(qd.f32, shape=(16,)), qd.field(qd.f32, shape=(16,))) for _ in range(k)]
    lines = ["def k_loops(s: qd.f32):"]
    for j in range(k):
        lines += [f"    m{j} = a{j}[0] * s",
                  "    for i in range(16):",
                  f"        b{j}[i] = a{j}[i] * m{j} + 1.0"]
    ns = {"qd": qd}
    for j, (a, b) in enumerate(fields):
        ns[f"a{j}"], ns[f"b{j}"] = a, b
    exec("\n".join(lines) + "\n", ns)
    return qd.kernel(ns["k_loops"]), fields


class _CountingAnalysis:
    """Numba's analysis module, counting the whole-function analyses it is asked for."""

    def __init__(self, analysis):
        self._analysis, self.calls = analysis, 0

    def __getattr__(self, name):
        fn = getattr(self._analysis, name)
        if name.startswith("compute_"):
            def counted(*args, **kwargs):
                self.calls += 1
                return fn(*args, **kwargs)
            return counted
        return fn


def _cpu_state(kernel, param_types, templates=None):
    """The kernel's planned state on the CPU, its Tasks typed by one whole-kernel type inference
    (the reference; both targets take the types from their own lowering instead)."""
    state = untyped_compile(kernel, IRTools.for_cpu(), param_types, templates or {})
    argtypes = [param_types[n] for n in state.runtime_params] + [field_type(f, False) for f in state.hidden]
    whole_kernel = compiler.Compiler(cpu_target.typing_context, cpu_target.target_context, None, tuple(argtypes),
                                     None, cpu.compile_flags(False, entry=True), {})
    type_tasks(state, whole_kernel)
    return state


def _cuda_state(kernel, param_types, templates=None):
    """The kernel's planned state on CUDA, its Tasks typed by compiling them (each task is typed
    once, as it is lowered), and the types of the values that cross tasks."""
    from qd_numba.targets.cuda import plan as qc

    state = qc.compile_state(kernel, param_types, templates or {})
    _, _, temp_types = qc.compile_tasks(kernel, state, (9, 0), qc.kernel_field_slots(state))
    return state, temp_types


def _cuda_abi(state, temp_types):
    from qd_numba.targets.cuda import plan as qc
    from qd_numba.targets.cuda import tasks as cuda_tasks

    return cuda_tasks.CudaTaskABI(state, qc.kernel_field_slots(state), qc.field_token, state.task_plan.ret_slot,
                                  temp_types)


def _cut_all(state, abi, units):
    """Cut every unit; (statements created or copied, whole-kernel analyses run, the cuts)."""
    counting = _CountingAnalysis(state.tools.analysis)
    state.tools = dataclasses.replace(state.tools, analysis=counting)
    before = CUT_COUNTS["statements"]
    cuts = [cut_task(state, unit, abi) for unit in units]
    return CUT_COUNTS["statements"] - before, counting.calls, cuts


@pytest.mark.no_cuda_compile_check   # the CUDA cut is checked here directly
@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_cutting_is_linear_in_the_number_of_loops(target, rng):
    per_task, sizes = [], (3, 6, 12)
    for k in sizes:
        kernel, fields = _k_loop_kernel(k)
        if target == "cpu":
            state = _cpu_state(kernel, {"s": types.float32})
            abi, units = cpu.CpuTaskABI.for_state(state), [u for u in state.task_plan.units if u.kind == "range_for"]
        else:
            state, temp_types = _cuda_state(kernel, {"s": types.float32})
            abi, units = _cuda_abi(state, temp_types), state.task_plan.units
        statements, analyses, cuts = _cut_all(state, abi, units)
        assert analyses == 0                  # the plan's one liveness analysis is reused
        scope = state.func_ir.blocks[min(state.func_ir.blocks)].scope
        # blocks are copied sharing the kernel's scope: no per-block copy of every variable
        assert all(blk.scope is scope for cut in cuts for blk in cut.func_ir.blocks.values())
        assert len([u for u in units if u.kind == "range_for"]) == k
        per_task.append(statements / k)
        if k != sizes[0]:
            continue
        # the kernel computes what numpy does (the CPU compile cuts the same way)
        a_data = [rng.uniform(-1, 1, 16).astype(np.float32) for _ in range(k)]
        for (a, _), d in zip(fields, a_data):
            a.from_numpy(d)
        kernel(0.5)
        for (_, b), d in zip(fields, a_data):
            np.testing.assert_allclose(b.to_numpy(), d * (d[0] * np.float32(0.5)) + 1.0, rtol=1e-5)
    # statements per task do not grow with the number of tasks
    assert max(per_task) <= min(per_task) * 1.1


def _version_types(typemap, names):
    """kernel variable -> set of (widened) types of its SSA versions (``x``, ``x.1``, ...) in a
    task function's typemap."""
    out = {}
    for full, ty in typemap.items():
        base = full
        while base not in names and "." in base:
            base = base.rsplit(".", 1)[0]
        if base in names:
            out.setdefault(base, set()).add(types.unliteral(ty))
    return out


xs = qd.field(qd.f32, shape=(32,))
total = qd.field(qd.f32, shape=())


@qd.kernel
def mixed(a: qd.types.ndarray(dtype=qd.f64, ndim=1), k: qd.f32) -> qd.f32:
    total[None] = 0.0
    s = xs[0] * k
    for i in xs:
        total[None] += xs[i] * s
    for i, j in qd.ndrange(4, 8):        # the same name `i`, another type per task
        a[i * 8 + j] = a[i * 8 + j] * 2.0 + s
    return total[None] + 1.0


def _check_types(unit, typemap):
    found = _version_types(typemap, set(unit.types))
    assert found, unit.task.name
    for name, tys in found.items():
        assert tys == {unit.types[name]}, (unit.task.name, name, tys, unit.types[name])
    assert unit.task.types is unit.types
    return found


def test_tasks_carry_the_types_the_cpu_lowers(rng):
    param_types = {"a": types.Array(types.float64, 1, "C"), "k": types.float32}
    state = _cpu_state(mixed, param_types)
    units = state.task_plan.units
    assert [u.kind for u in units] == ["serial", "range_for", "range_for", "serial"]
    assert units[0].types["s"] == types.float32 and units[1].types["s"] == types.float32
    assert units[1].types["i"] == types.int64 and units[2].types["i"] == types.int64
    for unit in units[1:3]:   # each range-for's task function, typed from its live-ins' types only
        cut = cut_task(state, unit, cpu.CpuTaskABI.for_state(state))
        # fields come from the field table (the context parameter, last), never as parameters
        assert not any(n.startswith("__qd_field_") for n in cut.params)
        live = [n for n in cut.params if n != cpu.CTX]
        assert (cut.params[-1] == cpu.CTX) == (unit is units[1])   # the first loop reads xs and total
        argtypes = (types.intp, types.intp, *(unit.types[n] for n in live),
                    *([cpu.CTX_TYPE] if unit is units[1] else []))
        flags = cpu.compile_flags(False, entry=False)
        flags.no_compile = True
        cres = compiler.compile_ir(cpu_target.typing_context, cpu_target.target_context, cut.func_ir, argtypes,
                                   types.none, flags, {})
        found = _check_types(unit, cres.fndesc.typemap)
        assert set(live) <= set(found)
    # and the kernel runs as numpy computes it
    d = rng.uniform(0, 1, 32).astype(np.float32)
    xs.from_numpy(d)
    a = rng.uniform(-1, 1, 32)
    s = np.float32(d[0] * np.float32(3.0))
    ref_a = a * 2.0 + np.float64(s)
    got = mixed(a, 3.0)
    assert got == pytest.approx(float(np.sum(d.astype(np.float64) * s)) + 1.0, rel=1e-5)
    np.testing.assert_allclose(a, ref_a, rtol=1e-6)
    # the compiled kernel's Tasks, typed from the driver and task functions the CPU lowered (no
    # second type inference), carry the types the whole-kernel inference gives, but for the
    # loops' range plumbing in the serial code, which the CPU driver replaces by its launches, and
    # the flat-index binding a range(n) loop's task leaves out (its variable is the flat index)
    plumbing = {s.target.name for lp in state.loops for s in lp.plumbing}
    def names(blocks):
        return {v.name for blk in blocks for stmt in blk.body for v in stmt.list_vars()}

    left_out = [{s.target.name for lbl in u.labels for s in state.func_ir.blocks[lbl].body
                 if type(s).__name__ == "Assign"}
                - names(cut_task(state, u, cpu.CpuTaskABI.for_state(state)).func_ir.blocks.values())
                if u.kind == "range_for" else plumbing for u in units]
    assert "$qd_idx" in units[1].types and "$qd_idx" in left_out[1]
    compiled = target_for("cpu").kernel_backend(mixed).tasks((a, 3.0))   # the CPU's, on any --arch
    assert [t.types for t in compiled] == [{n: ty for n, ty in u.types.items() if n not in gone}
                                           for u, gone in zip(units, left_out)]
    assert plumbing & set(units[0].types)


@needs_cuda
def test_tasks_carry_the_types_cuda_lowers():
    from qd_numba.targets.cuda import plan as qc

    param_types = {"a": types.Array(types.float64, 1, "C"), "k": types.float32}
    state = qc.compile_state(mixed, param_types, {})
    _, compiled, temp_types = qc.compile_tasks(mixed, state, (9, 0), qc.kernel_field_slots(state))
    assert [u.kind for u, _, _ in compiled] == ["serial", "range_for", "range_for", "serial"]
    for unit, _, c in compiled:
        found = _check_types(unit, c.typemap)
        assert set(unit.loads) <= set(found) and set(unit.stores) <= set(found)
    assert temp_types["s"] == types.float32
    # the returned f64 is converted to the annotation (-> qd.f32) before it leaves the kernel
    assert temp_types["$qd_return"] == state.task_plan.return_type == types.float32
    # the Task list (what kernel.tasks() returns) carries the same types
    assert [t.types for t in state.tasks] == [u.types for u, _, _ in compiled]


def _globals_and_copies(func_ir):
    """(names of the globals each call of the entry block calls, copies of a field argument)."""
    entry = func_ir.blocks[min(func_ir.blocks)]
    bound = {stmt.target.name: stmt.value.value for stmt in entry.body
             if type(getattr(stmt, "value", None)).__name__ in ("Global", "FreeVar")}
    calls = [getattr(bound.get(stmt.value.func.name), "__name__", "?") for stmt in entry.body
             if getattr(getattr(stmt, "value", None), "op", None) == "call"]
    copies = [stmt for blk in func_ir.blocks.values() for stmt in blk.body
              if type(getattr(stmt, "value", None)).__name__ == "Var" and stmt.value.name.startswith("__qd_field_")]
    return calls, copies


@pytest.mark.no_cuda_compile_check   # the CUDA cut is checked here directly
@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_task_prologue_is_short(target, rng):
    """Every statement of a task is typed and lowered once per task (~0.4 ms each on CUDA): a
    field is bound by one call (the function's global bound once per block), the body reads the
    field's argument itself rather than a copy per reference, and a CUDA loop is one call."""
    a, b, c = (qd.field(qd.f32, shape=(40,)) for _ in range(3))

    @qd.kernel
    def three():
        for i in a:
            b[i] = a[i] * 2.0 + c[i] - a[i]

    if target == "cpu":
        state = _cpu_state(three, {})
        abi, units = cpu.CpuTaskABI.for_state(state), [u for u in state.task_plan.units if u.kind == "range_for"]
    else:
        state, temp_types = _cuda_state(three, {})
        abi, units = _cuda_abi(state, temp_types), state.task_plan.units
    (cut,) = _cut_all(state, abi, units)[2]
    calls, copies = _globals_and_copies(cut.func_ir)
    assert copies == []
    assert calls.count("field_from_ctx") == 3
    entry = cut.func_ir.blocks[min(cut.func_ir.blocks)].body
    fn_globals = [stmt for stmt in entry if type(getattr(stmt, "value", None)).__name__ == "Global"
                  and getattr(stmt.value.value, "__name__", "") == "field_from_ctx"]
    assert len(fn_globals) == 1
    if target == "cuda":
        assert "grid_loop" in calls and "grid_start" not in calls and "grid_stride" not in calls
    da, dc = rng.uniform(-1, 1, 40).astype(np.float32), rng.uniform(-1, 1, 40).astype(np.float32)
    a.from_numpy(da)
    c.from_numpy(dc)
    three()
    np.testing.assert_allclose(b.to_numpy(), da * 2 + dc - da, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="x86-64 vector code")
def test_cpu_field_loop_is_vectorized_once(monkeypatch, rng):
    """A field loop's task is one vectorized loop (LLVM's ``vector.body``): a copy of a field
    argument per reference kept LLVM from vectorizing it (3x slower than ``numba.njit`` on the
    same loop), and the driver's two calls of the task stay out of line so the loop is
    optimized and compiled once rather than once per call site."""
    if qd.config.current.arch != "cpu":
        pytest.skip("the CPU target's code (the suite runs on another arch)")
    libraries = []
    real = cpu.KernelLibrary._optimize_final_module

    def keep(self):
        real(self)
        libraries.append(self)

    monkeypatch.setattr(cpu.KernelLibrary, "_optimize_final_module", keep)
    a, b = qd.field(qd.f32, shape=(4096,)), qd.field(qd.f32, shape=(4096,))

    @qd.kernel
    def scale():
        for i in a:
            b[i] = a[i] * 3.0 - 1.0

    data = rng.uniform(-1, 1, 4096).astype(np.float32)
    a.from_numpy(data)
    scale()
    np.testing.assert_allclose(b.to_numpy(), data * 3 - 1, rtol=1e-6, atol=1e-6)
    if not libraries:
        pytest.skip("kernel loaded from the offline cache")
    loops = re.findall(r"^vector\.body[.\d]*:", str(libraries[-1]._final_module), re.M)
    assert len(loops) == 1, loops


def _space_calls(func_ir) -> set:
    """Names of the space intrinsics a task function calls (lowering/spaces.py)."""
    bound = {stmt.target.name: getattr(stmt.value.value, "__name__", "?") for blk in func_ir.blocks.values()
             for stmt in blk.body if type(getattr(stmt, "value", None)).__name__ in ("Global", "FreeVar")}
    names = {bound.get(stmt.value.func.name) for blk in func_ir.blocks.values() for stmt in blk.body
             if getattr(getattr(stmt, "value", None), "op", None) == "call"}
    return names & {"range_dim", "ndrange_dim", "shape_space", "space_total", "space_index"}


# (loop header, what the flat index maps to, space intrinsics the task still calls on (cpu, cuda))
_LOOPS = {
    "range(n)": ("for i in range(n):", lambda n: np.arange(max(n, 0)), (set(), set())),
    "range(True)": ("for i in range(True):", lambda n: np.arange(1), (set(), set())),   # range takes a bool
    "range(lo, n)": ("for i in range(3, n):", lambda n: np.arange(3, max(n, 3)),
                     ({"space_index"}, {"range_dim", "space_total", "space_index"})),
    "range(n, lo, -2)": ("for i in range(n, 1, -2):", lambda n: np.arange(n, 1, -2) if n > 1 else np.arange(0),
                         ({"space_index"}, {"range_dim", "space_total", "space_index"})),
    "field": ("for i in a:", lambda n: np.arange(40), (set(), {"shape_space", "space_total"})),
    "field with offset": ("for i in d:", lambda n: np.arange(-5, 35),
                          ({"space_index"}, {"shape_space", "space_total", "space_index"})),
}


@pytest.mark.no_cuda_compile_check   # the CUDA cut is checked here directly
@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("loop", list(_LOOPS))
def test_flat_index_is_the_loop_variable(target, loop, rng):
    """A loop over ``range(n)`` or a 1-d field without offset binds its variable to the flat index
    itself, and a GPU task loops to ``n`` directly: no space or ``space_index`` in the task (each
    statement is typed and lowered per task). Other loops keep them; every loop visits the same
    indices as Python, for counts from negative to past the field."""
    header, expected, (on_cpu, on_cuda) = _LOOPS[loop]
    a, b = qd.field(qd.f32, shape=(40,)), qd.field(qd.i32, shape=(40,))
    d = qd.field(qd.i32, shape=(40,), offset=(-5,))
    ns = {"qd": qd, "a": a, "b": b, "d": d}
    source = (f"def visit(n: qd.i32):\n    {header}\n        b[(i + 45) % 40] += 1 + i * 0\n"
              if loop != "field with offset" else f"def visit(n: qd.i32):\n    {header}\n        b[i + 5] += 1\n")
    exec(source, ns)
    visit = qd.kernel(ns["visit"])
    types_ = {"n": types.int32}
    if target == "cpu":
        state = _cpu_state(visit, types_)
        abi, units = cpu.CpuTaskABI.for_state(state), [u for u in state.task_plan.units if u.kind == "range_for"]
    else:
        state, temp_types = _cuda_state(visit, types_)
        abi, units = _cuda_abi(state, temp_types), state.task_plan.units
    (cut,) = _cut_all(state, abi, units)[2]
    assert _space_calls(cut.func_ir) == (on_cpu if target == "cpu" else on_cuda)
    if target == "cuda" and loop == "range(n)":
        assert "$qd_space" not in cut.params and "$qd_total" not in cut.params
    for n in (-3, 0, 1, 17, 40):
        b.from_numpy(np.zeros(40, np.int32))
        visit(n)
        want = np.zeros(40, np.int32)
        np.add.at(want, (expected(n) + 45) % 40 if loop != "field with offset" else expected(n) + 5, 1)
        np.testing.assert_array_equal(b.to_numpy(), want, err_msg=f"{loop}, n={n}")
