"""CheckReadonlyWrites: a kernel that writes to a read-only ndarray argument is a type error.
CheckArgumentWrites (below): assignments to kernel arguments and atomics on what cannot be written.

Input: the kernel IR after RewriteSubscripts (stores are ``SetItem``/``StaticSetItem``;
atomic updates and element write-backs are calls to the helpers of lowering/subscripts.py).
A numpy array with ``flags.writeable == False`` is typed as a read-only Numba array; without
this check the failure surfaces deep inside the typing of the launch as a Numba dump. Here it
is a :class:`QuadrantsTypeError` naming the kernel, the argument and the line of the write.

Writes through an ``@numba.njit`` callee are not seen here; Numba's own error covers them.
Changes nothing.
"""

from __future__ import annotations

from numba.core import types

from ..errors import QuadrantsSyntaxError, QuadrantsTypeError
from ..lang import ATOMIC_FUNCTIONS
from ..lowering import subscripts
from ..typing.field import FieldType
from .base import argument_of, try_static
from .rewrite_subscripts import subscript_of

_WRITING_HELPERS = (subscripts.atomic_update, subscripts.nested_atomic, subscripts.write_back,
                    subscripts.atomic_cas_update, subscripts.nested_atomic_cas)


def is_readonly(ty) -> bool:
    """A read-only array type: a Numba array, or a FieldType for an ndarray of vectors."""
    if isinstance(ty, FieldType):
        return ty.readonly
    return isinstance(ty, types.Array) and not ty.mutable





class CheckReadonlyWrites:
    name = "check_readonly_writes"

    def run(self, state) -> bool:
        readonly = {name for name, ty in state.param_types.items() if is_readonly(ty)}
        if not readonly:
            return False
        ir = state.ir
        state.refresh_definitions()
        for block in state.func_ir.blocks.values():
            for stmt in block.body:
                if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
                    written = stmt.target
                elif isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr) and stmt.value.op == "call" \
                        and stmt.value.args and try_static(state, stmt.value.func) in _WRITING_HELPERS:
                    written = stmt.value.args[0]
                else:
                    continue
                arg = argument_of(state, written)
                if arg is not None and arg.name in readonly:
                    raise state.error(QuadrantsTypeError,
                                      f"argument '{arg.name}' is a read-only array (numpy flags.writeable is "
                                      "False) but the kernel writes to it", stmt.loc)
        return False


class CheckArgumentWrites:
    """Writes Quadrants rejects that would otherwise pass silently: a kernel argument assigned
    to (``x = ...``, ``x += ...``: it is immutable in the kernel) and an atomic operation whose
    destination is a constant, an expression or a kernel argument (nothing would be updated).
    Input: the kernel IR before RewriteSubscripts (atomics are still ``qd.atomic_<op>`` calls).
    Each error is a :class:`QuadrantsSyntaxError` naming the kernel, the argument and the line.
    Changes nothing."""

    name = "check_argument_writes"

    def run(self, state) -> bool:
        ir = state.ir
        arguments = set(state.runtime_params)
        state.refresh_definitions()
        for block in state.func_ir.blocks.values():
            for stmt in block.body:
                if not isinstance(stmt, ir.Assign):
                    continue
                # x = x + 1 defines a new version of x (x.1): its unversioned name is the argument's
                if stmt.target.unversioned_name in arguments and not isinstance(stmt.value, ir.Arg):
                    raise state.error(QuadrantsSyntaxError, f"kernel argument '{stmt.target.unversioned_name}' is "
                                      "immutable in "
                                      "the kernel; to change its value, copy it to a new variable first", stmt.loc)
                value = stmt.value
                if isinstance(value, ir.Expr) and value.op == "call" and value.args:
                    fn = try_static(state, value.func)
                    if callable(fn) and fn in ATOMIC_FUNCTIONS:
                        _check_atomic_destination(state, f"qd.atomic_{ATOMIC_FUNCTIONS[fn]}", value.args[0],
                                                  arguments, stmt.loc)
        return False


def _check_atomic_destination(state, what, dest, arguments, loc) -> None:
    ir = state.ir
    if dest.unversioned_name in arguments:
        problem = f"the kernel argument '{dest.unversioned_name}' (immutable in the kernel)"
    elif not state.is_temp(dest) or subscript_of(state, dest) is not None:
        return
    else:
        d = state.definition(dest)
        problem = "a constant" if isinstance(d, (ir.Const, ir.Global, ir.FreeVar)) else "an expression"
    raise state.error(QuadrantsSyntaxError, f"{what}: the destination (first operand) is {problem}, which cannot "
                      "be written; use a field or ndarray element (x[i]) or a local variable", loc)
