"""ResolveGlobals: fold compile-time attribute/item access; fields become hidden arguments.

* ``getattr`` / ``static_getitem`` on a compile-time Python object (a global, a free
  variable, a bound template value) is evaluated now: ``self.x`` -> the field ``x``,
  ``x.shape`` -> a constant tuple, ``qd.sin`` -> the function.
* Every reference to a ``Field`` (or ``Ndarray``) object becomes a read of a hidden kernel
  argument ``__qd_field_k`` (appended after the runtime parameters). Numba never sees the
  Python object: it would freeze the buffer as a constant, and with a parallel backend dead-
  code-eliminate writes to it.
* Referencing a ``@qd.kernel`` inside a kernel is an error (kernels cannot be nested).
* A global list read at a constant index is folded like a tuple, with a
  :class:`~qd_numba.errors.QuadrantsWarning` (once per kernel and global): the kernel keeps the
  value it had at compile time.

:class:`CheckGlobals` runs once compile-time folding is done (the dead side of ``qd.static``
branches is gone): every global still referenced must be one Numba can compile. An undefined
name, a plain Python function or a list raises our error at the statement that uses it, instead
of Numba's ``NameError`` or "reflected list" report from deep inside the kernel's compilation.

Never touches control flow.
"""

from __future__ import annotations

import types as pytypes
import warnings
import weakref

from ..errors import QuadrantsNameError, QuadrantsSyntaxError, QuadrantsTypeError, QuadrantsWarning
from ..field import ArrayData
from ..frontend.objects import KernelObject, QdFunc
from ..matrix import Matrix
from ..struct import StructField
from .base import MISSING, hidden_argument, try_static

_warned_frozen = weakref.WeakKeyDictionary()  # kernel's Python function -> lists it was warned about


def _foldable(value) -> bool:
    """Values whose attributes are safe to evaluate at compile time."""

    if isinstance(value, (Matrix, type(Matrix))):  # Numba types these (typing/matrix.py), methods too
        return False
    if isinstance(value, (ArrayData, pytypes.ModuleType, QdFunc)):
        return True
    if isinstance(value, (int, float, bool, str, tuple, list, dict, type(None))):
        return True
    # instances of user classes (data-oriented objects, template values), not Numba values
    return not type(value).__module__.startswith(("numba", "numpy", "builtins", "llvmlite"))


class ResolveGlobals:
    name = "resolve_globals"

    def run(self, state) -> bool:
        ir = state.ir

        changed = False
        self._new_args = []
        renames = {}          # a temporary that loaded a field -> the field's hidden argument
        static_inputs = None  # computed when first needed
        state.refresh_definitions()
        definitions = state.func_ir._definitions
        for block in state.func_ir.blocks.values():
            for k, stmt in enumerate(block.body):
                if not isinstance(stmt, ir.Assign):
                    continue
                value = stmt.value
                if isinstance(value, ir.Expr) and value.op in ("getattr", "static_getitem", "getitem"):
                    base = try_static(state, value.value)
                    if base is MISSING or not _foldable(base) or isinstance(base, ArrayData):
                        continue
                    if isinstance(base, StructField) and value.op != "getattr":
                        continue  # an element of a struct field: passes/structs.py
                    if value.op == "getitem":  # x[0] with a constant index (Python >= 3.12 bytecode)
                        index = try_static(state, value.index)
                        if index is MISSING or not isinstance(base, (tuple, list, dict)):
                            continue
                    try:
                        folded = getattr(base, value.attr) if value.op == "getattr" else \
                            base[value.index] if value.op == "static_getitem" else base[index]
                    except (AttributeError, IndexError, KeyError, TypeError):
                        continue
                    if isinstance(base, list) and value.op != "getattr":
                        if static_inputs is None:
                            static_inputs = _static_inputs(state)
                        if stmt.target.name not in static_inputs:
                            _warn_frozen_list(state, value.value, stmt.loc)
                    value = ir.Global(f"{stmt.target.name}", folded, stmt.loc)
                    block.body[k] = stmt = ir.Assign(value, stmt.target, stmt.loc)
                    changed = True
                if isinstance(value, (ir.Global, ir.FreeVar)):
                    obj = value.value
                    if isinstance(obj, KernelObject):
                        raise state.error(QuadrantsSyntaxError,
                                          f"cannot call kernel '{obj.name}' from a kernel; use @qd.func for helpers",
                                          stmt.loc)
                    if isinstance(obj, ArrayData):
                        hidden = hidden_argument(state, obj, stmt.loc, into=self._new_args)
                        target = stmt.target.name
                        if target.startswith("$") and len(definitions.get(target, ())) == 1:
                            renames[target] = hidden.name     # its uses read the argument itself
                            block.body[k] = None
                        else:
                            block.body[k] = ir.Assign(hidden, stmt.target, stmt.loc)
                        changed = True
        if renames:
            # every statement is typed and lowered once per task that holds it: a field's loads
            # (one per reference in the source) would be copies of its argument
            for block in state.func_ir.blocks.values():
                block.body = [stmt for stmt in block.body if stmt is not None]
            state.tools.ir_utils.replace_var_names(state.func_ir.blocks, renames)
        if self._new_args:
            entry = state.func_ir.blocks[min(state.func_ir.blocks)]
            entry.body[:0] = self._new_args
        if changed:
            state.refresh_definitions()
        return changed



def _static_inputs(state) -> set:
    """Names of the variables the arguments of ``qd.static(...)`` calls are computed from (a
    list item read inside ``qd.static`` is meant to be a compile-time constant)."""
    from ..lang import static as qd_static

    ir = state.ir
    work = [arg for block in state.func_ir.blocks.values() for stmt in block.body
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call"
            and try_static(state, stmt.value.func) is qd_static for arg in stmt.value.args]
    seen = set()
    while work:
        var = work.pop()
        if var.name not in seen:
            seen.add(var.name)
            definition = state.definition(var)
            work.extend(definition.list_vars() if hasattr(definition, "list_vars") else ())
    return seen


def _warn_frozen_list(state, list_var, loc) -> None:
    """A global list read at a constant index: its element becomes a compile-time constant."""
    d = state.definition(list_var)
    if not isinstance(d, (state.ir.Global, state.ir.FreeVar)) or d.name.startswith("$"):
        return  # a list qd.static(...) produced, or one inside a compile-time object
    warned = _warned_frozen.setdefault(state.func_ir.func_id.func, set())
    if d.name in warned:
        return
    warned.add(d.name)
    message = (f"the global list '{d.name}' is read at a constant index: the kernel keeps the value it had "
               f"when it compiled and never sees later changes to '{d.name}'; make '{d.name}' a tuple if it "
               "is constant, or use a field for data that changes")
    # attributed to the kernel's line, which the warning shows with its source
    warnings.warn_explicit(f"in kernel '{state.kernel_name}': {message}", QuadrantsWarning,
                           loc.filename or "<unknown>", loc.line or 0)


class CheckGlobals:
    """Reject globals a kernel cannot use (see the module docstring). Never changes the IR."""

    name = "check_globals"

    def run(self, state) -> bool:
        ir = state.ir
        for block in state.func_ir.blocks.values():
            for stmt in block.body:
                if not isinstance(stmt, ir.Assign):
                    continue
                value = stmt.value
                if isinstance(value, (ir.Global, ir.FreeVar)):
                    problem = _unusable_global(state, value.name, value.value)
                elif isinstance(value, ir.Expr) and value.op == "getattr":
                    problem = _missing_module_attribute(state, value)
                else:
                    continue
                if problem is not None:
                    raise state.error(*problem, stmt.loc)
        return False


def _unusable_global(state, name, value):
    """(error class, message) for a global the kernel cannot use, or None."""
    if isinstance(value, state.ir.UndefinedType):
        return QuadrantsNameError, f"name '{name}' is not defined"
    if isinstance(value, list):
        return QuadrantsTypeError, (
            f"the global list '{name}' cannot be indexed at run time in a kernel: make it a tuple, "
            f"loop over it with 'for v in qd.static({name})', or keep the data in a field or ndarray")
    if isinstance(value, pytypes.FunctionType) and not (value.__module__ or "").startswith("qd_numba") \
            and not _numba_can_type(state, value):
        return QuadrantsTypeError, (
            f"'{value.__qualname__}' is a plain Python function: decorate it with @qd.func (inlined into "
            "kernels) or @numba.njit to call it from a kernel")
    return None


def _missing_module_attribute(state, expr):
    module = try_static(state, expr.value)
    if isinstance(module, pytypes.ModuleType) and not hasattr(module, expr.attr):
        shown = "qd" if module.__name__ == "qd_numba" else module.__name__
        return QuadrantsNameError, f"module '{shown}' has no attribute '{expr.attr}'"
    return None


def _numba_can_type(state, fn) -> bool:
    """Whether Numba compiles calls of the Python function ``fn`` for the IR's target (an
    ``@overload`` or ``register_jitable`` registration)."""
    if state.tools.flavour.startswith("numba.cuda"):
        from numba.cuda.descriptor import cuda_target as target
    else:
        from numba.core.registry import cpu_target as target
    context = target.typing_context
    context.refresh()
    try:
        context.resolve_value_type(fn)
    except Exception:  # Numba's TypingError, from either of its two copies
        return False
    return True
