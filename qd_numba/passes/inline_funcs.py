"""InlineFuncs: every call of a ``@qd.func`` is replaced by the func's body.

Funcs are inlined at the IR level, before offloading, so that a top-level loop inside a
func called at the top level of a kernel still becomes a task, and fields/static values
inside funcs resolve like the kernel's own. Calls to ``@numba.njit`` functions and
``@qd.real_func`` functions are left as calls (frontend/real_func.py); a real function in a
differentiated kernel is an error. In a differentiated kernel (``kernel.grad``, forward mode),
``@numba.njit`` functions and qd.math's compositions (``qd.math.normalize``) are inlined too, so
the adjoint rules see what they compute; one whose body cannot be inlined is an error naming
the call. Recursion of qd.funcs is a QuadrantsSyntaxError, and so is a ``return`` inside
non-static control flow of any func (passes/return_rules.py, Quadrants' rule).
"""

from __future__ import annotations

import inspect

import numpy as np
from numba.core.dispatcher import Dispatcher

from .. import math as qd_math
from ..errors import QuadrantsSyntaxError
from ..frontend.diagnostics import run_frontend
from ..frontend.objects import QdFunc
from ..frontend.real_func import QdRealFunc
from ..lowering.subscripts import spread_item
from ..ops.math_funcs import FUNCS as _COMPOSITIONS
from ..typing.matrix import MatrixType
from .base import MISSING, try_static
from .ir_builder import emit_call
from .return_rules import return_in_control_flow, return_problem
from .stream_blocks import reject_with_in_func


class InlineFuncs:
    name = "inline_funcs"

    def run(self, state) -> bool:

        ir = state.ir
        changed = False
        progress = True
        while progress:
            progress = False
            state.refresh_definitions()
            for label, block in list(state.func_ir.blocks.items()):
                for i, stmt in enumerate(block.body):
                    if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr)
                            and stmt.value.op == "call"):
                        continue
                    callee = try_static(state, stmt.value.func)
                    if isinstance(callee, QdRealFunc) and state.autodiff_mode is not None:
                        raise state.error(QuadrantsSyntaxError, f"qd.real_func '{callee.name}' cannot be "
                                          "called in a differentiated kernel (Quadrants' rule too)", stmt.loc)
                    if isinstance(callee, QdRealFunc) and callee.takes_data \
                            and _check_data_arguments(state, block, stmt, callee):
                        changed = progress = True
                        break
                    if state.autodiff_mode is not None and _inlined_for_autodiff(callee):
                        stack = state.block_stacks.get(label, ())
                        self._inline_python(state, label, block, i, stmt, callee, stack)
                        changed = progress = True
                        break
                    if callee is MISSING or not isinstance(callee, QdFunc):
                        continue
                    stack = state.block_stacks.get(label, ())
                    if callee in stack:
                        chain = " -> ".join(f.name for f in (*stack, callee))
                        raise state.error(QuadrantsSyntaxError,
                                          f"recursive qd.func calls are not supported ({chain})", stmt.loc)
                    if stmt.value.vararg is not None:
                        _spread_vararg(state, block, stmt, callee)
                        state.refresh_definitions()
                        i = block.body.index(stmt)
                    self._inline(state, label, block, i, callee, stack)
                    changed = progress = True
                    break
                if progress:
                    break
        return changed

    @staticmethod
    def _inline(state, label, block, i, callee, stack):
        tools = state.tools
        callee_ir = callee.frontend_ir(tools)
        result = block.body[i].target
        problem = return_in_control_flow(tools, callee_ir, callee.fn)
        if problem is not None:
            raise state.error(QuadrantsSyntaxError, f"qd.func '{callee.name}': {problem[0]}", problem[1])
        if callee.return_type is not None:
            problem = return_problem(tools, callee_ir, callee.return_type, "qd.func", static_loops=True)
            if problem is not None:
                message, loc = problem
                raise state.error(QuadrantsSyntaxError, f"qd.func '{callee.name}': {message}", loc)
        reject_with_in_func(state, callee_ir, callee.name)
        worker = tools.inline.InlineWorker(validator=None)
        _, callee_blocks, var_dict, new_blocks = worker.inline_ir(
            state.func_ir, block, i, callee_ir, callee.fn.__code__.co_freevars)
        state.inlined_temps.update(new.name for old, new in var_dict.items() if state.is_temp(old))
        converted_to = callee.value_type(state.config)
        for new_label, new_block in new_blocks:
            # the caller's continuation keeps the caller's stack; the callee's blocks add the callee
            state.block_stacks[new_label] = (*stack, callee) if new_label in callee_blocks else stack
            if converted_to is not None and new_label in callee_blocks:
                _convert_returned(state, new_block, result, converted_to)


    @staticmethod
    def _inline_python(state, label, block, i, stmt, callee, stack):
        """A differentiated kernel's call of a ``@numba.njit`` function or a qd.math composition:
        its body inlined like a qd.func's, so the adjoint rules apply to what it computes."""
        fn = getattr(callee, "py_func", callee)
        name = getattr(fn, "__qualname__", repr(fn))
        if callee in stack:
            chain = " -> ".join(getattr(f, "name", None) or f.__qualname__ for f in (*stack, callee))
            raise state.error(QuadrantsSyntaxError, f"autodiff: recursive calls cannot be differentiated ({chain})",
                              stmt.loc)
        call = stmt.value
        if call.vararg is not None or call.kws or not inspect.isfunction(fn) or inspect.isgeneratorfunction(fn):
            raise state.error(QuadrantsSyntaxError, f"autodiff: the call of '{name}' cannot be differentiated: "
                              "its body cannot be inlined (call it with positional arguments; it must be a plain "
                              "@numba.njit function)", stmt.loc)
        try:
            callee_ir = run_frontend(state.tools, fn, name)
        except QuadrantsSyntaxError as e:
            raise state.error(QuadrantsSyntaxError, f"autodiff: the call of '{name}' cannot be differentiated: "
                              f"its body cannot be read ({e})", stmt.loc) from None
        worker = state.tools.inline.InlineWorker(validator=None)
        _, callee_blocks, var_dict, new_blocks = worker.inline_ir(state.func_ir, block, i, callee_ir,
                                                                 fn.__code__.co_freevars)
        state.inlined_temps.update(new.name for old, new in var_dict.items() if state.is_temp(old))
        for new_label, new_block in new_blocks:
            state.block_stacks[new_label] = (*stack, callee) if new_label in callee_blocks else stack
            if new_label in callee_blocks:
                _numpy_as_qd(state, new_block)


def _numpy_as_qd(state, block) -> None:
    """numpy's elementwise math functions (``np.sin``) in an inlined body become qd.math's, which
    have adjoint rules and compile for every target."""
    ir = state.ir
    modules = {}
    for k, stmt in enumerate(block.body):
        if not isinstance(stmt, ir.Assign):
            continue
        value = stmt.value
        if isinstance(value, (ir.Global, ir.FreeVar)) and value.value is np:
            modules[stmt.target.name] = True
            continue
        fn = value.value if isinstance(value, (ir.Global, ir.FreeVar)) else \
            getattr(np, value.attr, None) if isinstance(value, ir.Expr) and value.op == "getattr" \
            and value.value.name in modules else None
        name = _NUMPY_MATH.get(fn) if isinstance(fn, np.ufunc) else None
        if name is not None:
            block.body[k] = ir.Assign(ir.Global(name, getattr(qd_math, name), stmt.loc), stmt.target, stmt.loc)


_NUMPY_MATH = {np.sin: "sin", np.cos: "cos", np.tan: "tan", np.arcsin: "asin", np.arccos: "acos", np.arctan: "atan",
               np.arctan2: "atan2", np.exp: "exp", np.log: "log", np.log2: "log2", np.sqrt: "sqrt", np.tanh: "tanh",
               np.abs: "abs", np.fabs: "abs", np.floor: "floor", np.ceil: "ceil", np.power: "pow", np.sign: "sign",
               np.maximum: "max", np.minimum: "min"}


def _inlined_for_autodiff(callee) -> bool:
    """``@numba.njit`` functions and qd.math's compositions (``qd.math.normalize``): inlined into
    differentiated kernels."""
    if isinstance(callee, Dispatcher):
        return True
    try:
        return callee in _COMPOSITIONS
    except TypeError:           # unhashable
        return False


def _convert_returned(state, block, result, annotation) -> None:
    """The callee's ``return v`` became ``result = v`` in ``block``: make it
    ``result = qd.cast(v, dtype)`` with the return annotation's dtype, as Quadrants casts a
    func's returned value (``qd.cast``, not the kernel's checked conversion: autodiff knows it)."""
    ir = state.ir
    dtype = annotation.dtype if isinstance(annotation, MatrixType) else annotation
    for k, stmt in enumerate(block.body):
        if isinstance(stmt, ir.Assign) and stmt.target.name == result.name and isinstance(stmt.value, ir.Var):
            fn = block.scope.redefine("$qd_cast", stmt.loc)
            dtype_var = block.scope.redefine("$qd_return_dtype", stmt.loc)
            block.body[k:k + 1] = [
                ir.Assign(ir.Global("cast", qd_math.cast, stmt.loc), fn, stmt.loc),
                ir.Assign(ir.Global("dtype", dtype, stmt.loc), dtype_var, stmt.loc),
                ir.Assign(ir.Expr.call(fn, [stmt.value, dtype_var], (), stmt.loc), result, stmt.loc)]
            return


def _check_data_arguments(state, block, stmt, callee) -> bool:
    """``f(x, i)`` of a real function taking a field or ndarray ``x``: ``f(check(x), i)``, the
    check (frontend/real_func.py) typed at this statement, so a wrong argument is our error
    naming the calling line. False if every such argument is checked already."""
    ir = state.ir
    call, checks = stmt.value, callee.data_checks()
    names = [name for name, _ in callee.params]
    at = block.body.index(stmt)
    new = []

    def checked(name, var):
        if name not in checks:
            return var
        d = state.definition(var)
        if isinstance(d, ir.Expr) and d.op == "call" and try_static(state, d.func) is checks[name]:
            return var
        out = block.scope.redefine("$qd_data_arg", stmt.loc)
        new.extend(emit_call(ir, checks[name], [var], out, stmt.loc, block.scope.redefine("$qd_check", stmt.loc)))
        return out

    call.args = [checked(names[k] if k < len(names) else None, a) for k, a in enumerate(call.args)]
    call.kws = [(k, checked(k, v)) for k, v in call.kws]
    block.body[at:at] = new
    return bool(new)


def _spread_vararg(state, block, stmt, callee) -> None:
    """``f(a, *I)``: Numba inlines no call with ``*args``, so pass ``I``'s items one by one, as
    many as ``f`` has positional parameters left (``spread_item`` checks ``I``'s length)."""
    ir = state.ir
    call = stmt.value
    params = inspect.signature(callee.fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        raise state.error(QuadrantsSyntaxError, f"calling qd.func '{callee.name}', which takes *args, with *args "
                          "is not supported", stmt.loc)
    positional = sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                     for p in params)
    count = positional - len(call.args) - len(call.kws)
    scope, loc = block.scope, call.loc
    fn = scope.redefine("$qd_spread_item", loc)
    new = [ir.Assign(ir.Global("spread_item", spread_item, loc), fn, loc)]
    consts = []
    for value in (*range(count), count):
        var = scope.redefine("$qd_spread_const", loc)
        new.append(ir.Assign(ir.Const(value, loc), var, loc))
        consts.append(var)
    items = []
    for k in range(count):
        item = scope.redefine("$qd_spread", loc)
        new.append(ir.Assign(ir.Expr.call(fn, [call.vararg, consts[k], consts[-1]], (), loc), item, loc))
        items.append(item)
    at = block.body.index(stmt)
    block.body[at:at] = new
    call.args = [*call.args, *items]
    call.vararg = None
