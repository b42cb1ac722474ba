"""The gated Numba pipeline of task functions (targets/task_pipeline.py): a kernel compiles to the
same device code with the gated pipeline and with Numba's full one, and computes the same values;
each gated pass runs exactly when its trigger is in the task's IR."""

from __future__ import annotations

import collections
import re

import numba
import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config
from qd_numba.targets import task_pipeline
from qd_numba.targets.cuda.compile import numba_cuda_importable

N = 24


@numba.njit
def njit_callee(v):
    return v * v - 1.0


@qd.func
def smooth(v):
    return qd.sqrt(v * v + 1.0)


def _programs():
    """Kernels over one field and one ndarray covering the task kinds and constructs whose passes
    are gated: range-for and serial tasks, a reduction, nested loops with break/continue, a
    static loop, vectors, njit and qd.func callees, an ndarray (array types: the rewrites run)."""
    f = qd.field(qd.f32, shape=N)
    g = qd.Vector.field(3, qd.f32, shape=N)

    @qd.kernel
    def fields_only(k: qd.f32) -> qd.f32:
        for i in f:
            f[i] = njit_callee(f[i]) * k + smooth(f[i])
        for i in g:
            v = qd.Vector([f[i], 2.0 * f[i], 3.0])
            for j in qd.static(range(3)):
                v[j] += j
            g[i] = v / (v.norm() + 1.0)
        total = 0.0
        for i in f:
            total += f[i] * g[i][1]
        return total

    @qd.kernel
    def with_ndarray(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(N):
            acc = 0.0
            for j in range(N):
                if j > i:
                    break
                if j % 3 == 1:
                    continue
                acc += a[j]
            f[i] = acc
        a[0] = f[N - 1] + 1.0

    return f, g, fields_only, with_ndarray


def _run(mode, rng):
    saved = config.current.task_pipeline
    config.current.task_pipeline = mode
    try:
        f, g, fields_only, with_ndarray = _programs()
        x = rng.uniform(-1, 1, N).astype(np.float32)
        a = rng.uniform(-1, 1, N).astype(np.float32)
        f.from_numpy(x)
        total = fields_only(1.5)
        out = (f.to_numpy(), g.to_numpy(), total)
        given = a.copy()
        with_ndarray(a)     # writes a[0] (copied back)
        return out + (f.to_numpy(), a), (x, given)
    finally:
        config.current.task_pipeline = saved


def _reference(x, a):
    f = (x * x - 1.0) * 1.5 + np.sqrt(x * x + 1.0)
    v = np.stack([f, 2 * f, np.full_like(f, 3.0)], axis=1) + np.arange(3, dtype=np.float32)
    g = v / (np.linalg.norm(v, axis=1, keepdims=True) + 1.0)
    total = float(np.sum(f * g[:, 1]))
    after = np.array([sum(a[j] for j in range(i + 1) if j % 3 != 1) for i in range(N)], np.float32)
    a2 = a.copy()
    a2[0] = after[-1] + 1.0
    return f, g, total, after, a2


def test_gated_and_full_pipelines_compute_the_same_values(rng, arch):
    seed = int(rng.integers(1 << 30))
    gated, inputs = _run("gated", np.random.default_rng(seed))
    full, _ = _run("full", np.random.default_rng(seed))
    for got_gated, got_full, want in zip(gated, full, _reference(*inputs)):
        np.testing.assert_array_equal(got_gated, got_full)
        np.testing.assert_allclose(got_gated, want, rtol=2e-5, atol=2e-5)


def _ptx(mode):
    from qd_numba.targets.cuda.plan import compile_check

    saved = config.current.task_pipeline
    config.current.task_pipeline = mode
    try:
        _f, _g, fields_only, with_ndarray = _programs()
        texts = []
        for kernel, params in ((fields_only, {"k": numba.types.float32}),
                               (with_ndarray, {"a": numba.types.Array(numba.types.float32, 1, "C")})):
            texts += [re.sub(r"\b_Z\w+", "ENTRY", c.ptx) for _unit, _task, c in compile_check(kernel, params, {})]
        return texts
    finally:
        config.current.task_pipeline = saved


@pytest.mark.skipif(not numba_cuda_importable(), reason="needs numba-cuda (the CUDA compile check)")
def test_gated_and_full_pipelines_emit_the_same_ptx():
    gated, full = _ptx("gated"), _ptx("full")
    assert len(gated) == len(full) >= 5
    assert gated == full


def test_each_gated_pass_runs_when_its_trigger_is_there(monkeypatch, arch):
    decided = collections.Counter()
    for name, (trigger, otherwise) in list(task_pipeline._GATES.items()):
        def counted(state, _trigger=trigger, _name=name):
            fired = _trigger(state)
            decided[_name, fired] += 1
            return fired
        monkeypatch.setitem(task_pipeline._GATES, name, (counted, otherwise))
    f, _g, _fields_only, with_ndarray = _programs()

    @qd.kernel
    def scale(k: qd.f32):
        for i in f:
            f[i] = smooth(f[i]) * k

    scale(2.0)          # no array, no string literal (a reduction has both): the rewrites are skipped
    assert decided["nopython_rewrites", False] > 0 and decided["nopython_rewrites", True] == 0
    decided.clear()
    with_ndarray(np.zeros(N, np.float32))
    assert decided["nopython_rewrites", True] > 0     # an array argument: the array rewrites run
    assert decided["inline_closure_likes", True] == 0 and decided["inline_closure_likes", False] > 0


def test_triggers_see_what_they_look_for():
    from numba.core import ir, types

    scope = ir.Scope(None, ir.Loc("x", 1))
    loc = ir.Loc("x", 1)
    block = ir.Block(scope, loc)
    fn = ir.Expr.make_function("f", None, None, None, loc)
    block.append(ir.Assign(fn, scope.redefine("$f", loc), loc))
    state = collections.namedtuple("State", "func_ir typemap")(
        collections.namedtuple("IR", "blocks")({0: block}), {"$f": types.float32})
    assert task_pipeline._has_make_function(state) and task_pipeline._has_closure_like(state)
    assert not task_pipeline._has_with(state) and not task_pipeline._has_array_or_string_literal(state)
    state.typemap["$a"] = types.Array(types.float32, 1, "C")
    assert task_pipeline._has_array_or_string_literal(state)


def test_task_pipeline_option_is_checked():
    with pytest.raises(qd.QuadrantsConfigError, match="task_pipeline"):
        config.config_from_env(task_pipeline="fast")


def test_lean_post_processing_gives_numbas_entry_variables(monkeypatch, rng, arch):
    """Inside a gated pipeline Numba's post-processing leaves the variables live on entry to each
    block for when they are read. Checked after every post-processing of real task compiles
    (both flavours where numba-cuda is there: the CUDA compile check runs here too): the lazy
    mapping is not computed until read, and then equals what Numba's own post-processing computes
    for the same IR."""
    flavours = ["numba.core"] + (["numba.cuda.core"] if numba_cuda_importable() else [])
    checked = collections.Counter()
    for flavour in flavours:
        task_pipeline._install_lean_post_processing(flavour)
        postproc = __import__(f"{flavour}.postproc", fromlist=["PostProcessor"])
        lean = postproc.PostProcessor.run
        numbas = lean.__wrapped__

        def checking(self, emit_dels=False, extend_lifetimes=False, _lean=lean, _numbas=numbas, _pp=postproc,
                     _flavour=flavour):
            result = _lean(self, emit_dels, extend_lifetimes)
            entry_vars = self.func_ir.block_entry_vars
            if isinstance(entry_vars, task_pipeline._EntryVars):
                assert entry_vars._pending is not None     # nothing computed yet
                lazy = {id(block): set(entry_vars[block]) for block in self.func_ir.blocks.values()}
                _numbas(_pp.PostProcessor(self.func_ir))      # Numba's, on the same IR
                eager = {id(block): set(self.func_ir.block_entry_vars[block])
                         for block in self.func_ir.blocks.values()}
                assert lazy == eager
                checked[_flavour] += 1
            return result

        monkeypatch.setattr(postproc.PostProcessor, "run", checking)
    _f, _g, fields_only, _with_ndarray = _programs()
    fields_only(1.5)
    # the kernel compiles for its arch (the CUDA compile check runs beside a CPU compile)
    assert checked["numba.core" if arch == "cpu" else "numba.cuda.core"] >= 10


def test_frontend_post_processes_leanly_and_copies_leave_the_results_out():
    """The bytecode frontend post-processes each function it reads (twice) the lean way too, and
    a copy of a kernel's IR (passes/base.copy_ir, once per compile) starts without Numba's
    post-processing results, which describe the IR they were computed on: no pass of ours reads
    them, and Numba computes them again for the task IRs it compiles."""
    from qd_numba.passes.base import IRTools, copy_ir

    f = qd.field(qd.f32, shape=N)

    def body():
        for i in f:
            f[i] = f[i] * 2.0

    for mode, lean in (("gated", True), ("full", False)):
        saved = config.current.task_pipeline
        config.current.task_pipeline = mode
        try:
            kernel = qd.kernel(body)
            for tools in (IRTools.for_cpu(),) + ((IRTools.for_cuda(),) if numba_cuda_importable() else ()):
                func_ir = kernel.frontend_ir(tools)
                assert isinstance(func_ir.block_entry_vars, task_pipeline._EntryVars) == lean
                if lean:
                    assert func_ir.block_entry_vars._pending is not None
                    assert not {"cfg", "usedefs", "livemap"} & set(vars(func_ir.variable_lifetime))
                copied = copy_ir(tools.ir, func_ir)
                assert copied.variable_lifetime is None and copied.block_entry_vars == {}
                assert func_ir.variable_lifetime is not None     # the original keeps its own
                assert sorted(copied.blocks) == sorted(func_ir.blocks)
        finally:
            config.current.task_pipeline = saved


def _flag_classes():
    from numba.core import compiler

    classes = [compiler.Flags]
    if numba_cuda_importable():
        from numba.cuda.flags import CUDAFlags

        classes.append(CUDAFlags)
    return classes


@pytest.mark.parametrize("base", _flag_classes(), ids=lambda c: c.__module__)
def test_lean_flags_hash_compare_and_read_as_numbas(base, rng):
    """Lean flags (task_pipeline.lean_flags) hash, compare and list their values as Numba's flags
    of the same options do, after every change, and against Numba's own flags objects."""
    lean = task_pipeline._lean_flags(base)
    assert lean is not base and issubclass(lean, base)
    bools = [name for name, option in base.options.items() if option.type is bool]
    for _ in range(20):
        chosen = rng.choice(bools, size=6, replace=False)
        ours, theirs = lean(), base()
        for name in chosen:
            value = bool(rng.integers(2))
            setattr(ours, name, value)
            setattr(theirs, name, value)
        assert ours.values() == theirs.values() and hash(ours) == hash(theirs)
        assert ours == theirs and theirs == ours and ours == ours.copy() and type(ours.copy()) is lean
        before = ours.copy()
        name = str(rng.choice(chosen))
        setattr(ours, name, not getattr(ours, name))      # a change after the values were memoised
        assert ours.values()[name] == getattr(ours, name) != before.values()[name]
        assert ours != theirs and ours != before and hash(ours) == hash(theirs)
        delattr(ours, name)                                # back to the option's default
        assert ours.values() == base(theirs).values() | {name: base.options[name].default}
        unset = lean()
        setattr(unset, name, base.options[name].default)   # a default set explicitly equals the unset one
        assert unset == lean() and unset == base()
    cache = {base(): "numba's"}
    assert cache[lean()] == "numba's"     # one key for Numba's template caches


def test_full_task_pipeline_keeps_numbas_flags(monkeypatch):
    from numba.core import compiler

    monkeypatch.setattr(config.current, "task_pipeline", "full")
    assert task_pipeline.lean_flags(compiler.Flags) is compiler.Flags
    monkeypatch.setattr(config.current, "task_pipeline", "gated")
    assert task_pipeline.lean_flags(compiler.Flags) is task_pipeline._lean_flags(compiler.Flags)


def _typing_contexts():
    from numba.core.registry import cpu_target

    contexts = [("cpu", cpu_target.typing_context)]
    if numba_cuda_importable():
        from numba.cuda.descriptor import cuda_target

        contexts.append(("cuda", cuda_target.typing_context))
    return contexts


@pytest.mark.parametrize("name, context", _typing_contexts(), ids=lambda v: v if isinstance(v, str) else "")
def test_call_memo_resolves_calls_as_numba_does(name, context, rng):
    """Inside a gated pipeline a call resolves to Numba's signature and implementation key, from
    the first resolution (which finds the template) and from the memo (which applies that template
    alone); a call no template accepts raises Numba's error both times."""
    import math
    import operator

    from numba.core import errors, types

    task_pipeline._install_call_memo()
    context.refresh()
    numeric = [types.int8, types.int32, types.int64, types.uint16, types.uint64, types.float32, types.float64,
               types.complex64, types.boolean]
    callees = [operator.add, operator.mul, operator.truediv, operator.floordiv, operator.lt, operator.and_,
               operator.pow, abs, min, max, math.sqrt, math.atan2, math.floor]
    cases = []
    for _ in range(60):
        callee = callees[int(rng.integers(len(callees)))]
        arity = 1 if callee in (abs, math.sqrt, math.floor) else 2
        args = [numeric[int(rng.integers(len(numeric)))] for _ in range(arity)]
        if arity == 2 and rng.integers(3) == 0:
            args[1] = types.literal(int(rng.integers(-5, 6)))
        cases.append((callee, tuple(args)))
    array = types.Array(types.float32, 2, "C")
    cases += [(operator.getitem, (array, types.UniTuple(types.int64, 2))), (operator.getitem, (array, types.int64)),
              (operator.setitem, (array, types.UniTuple(types.intp, 2), types.float64)),
              (operator.add, (types.unicode_type, types.int64))]      # no template accepts this one
    resolved = 0
    for callee, args in cases:
        fnty = context.resolve_value_type(callee)
        numbas = fnty.get_call_type.__wrapped__

        def numba_result():
            try:
                return numbas(fnty, context, args, {})
            except errors.TypingError as e:
                return type(e)

        want = numba_result()
        want_key = fnty._impl_keys.get(want.args) if not isinstance(want, type) else None
        for _attempt in ("finds the template", "from the memo"):
            with task_pipeline._lean_post_processing():
                try:
                    got = fnty.get_call_type(context, args, {})
                except errors.TypingError as e:
                    got = type(e)
            assert got == want, (name, callee, args)
            if not isinstance(want, type):
                assert fnty._impl_keys[got.args] == want_key
                resolved += 1
    assert resolved > 2 * 40      # most cases resolve (the rest are Numba's errors, checked the same)


def test_call_memo_applies_the_template_that_resolved_the_call():
    """A memo hit applies only the template that resolved the call before (so an overload or an
    intrinsic still refreshes what its lowering reads), with the same literal choice; Numba's
    resolution, outside a gated pipeline, tries the templates in order every time."""
    from numba.core import types
    from numba.core.registry import cpu_target
    from numba.core.typing.templates import AbstractTemplate, signature

    task_pipeline._install_call_memo()
    applied = []

    class IntsOnly(AbstractTemplate):
        key = "qd_test_call_memo"

        def generic(self, args, kws):
            applied.append("ints")
            if all(isinstance(a, types.Integer) for a in args):
                return signature(types.int64, *args)

    class Anything(AbstractTemplate):
        key = "qd_test_call_memo"

        def generic(self, args, kws):
            applied.append("anything")
            return signature(types.float64, *args)

    fnty = types.Function((IntsOnly, Anything))
    context = cpu_target.typing_context
    for args, want, first, then in (((types.float32,), types.float64, ["ints", "ints", "anything"], ["anything"]),
                                    ((types.int32,), types.int64, ["ints"], ["ints"])):
        for expected in (first, then, then):
            applied.clear()
            with task_pipeline._lean_post_processing():
                assert fnty.get_call_type(context, args, {}).return_type == want
            assert applied == expected
        applied.clear()
        assert fnty.get_call_type(context, args, {}).return_type == want      # Numba's own resolution
        assert applied == first


@pytest.mark.parametrize("flavour", ["numba.core"] + (["numba.cuda.core"] if numba_cuda_importable() else []))
def test_loc_memo_answers_as_numba(flavour):
    """Whether a lowering implementation takes ``loc``: the same answer as Numba's, for the
    implementations its target context holds and for functions with and without it."""
    import importlib

    task_pipeline._install_loc_memo(flavour)
    base = importlib.import_module(f"{flavour}.base")
    numbas = base._has_loc.__wrapped__

    def with_loc(context, builder, sig, args, loc=None):
        return loc

    def without_loc(context, builder, sig, args):
        return args

    if flavour == "numba.core":
        from numba.core.registry import cpu_target as target
    else:
        from numba.cuda.descriptor import cuda_target as target
    target.target_context.refresh()
    impls = [impl for selector in target.target_context._defns.values() for _sig, impl in selector.versions]
    assert len(impls) > 500
    for fn in impls + [with_loc, without_loc] * 2:
        assert base._has_loc(fn) == numbas(fn)
    assert base._has_loc(with_loc) and not base._has_loc(without_loc)
