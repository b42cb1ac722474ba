"""CheckReadonlyWrites: a kernel that writes to a read-only ndarray argument is a type error.

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

from ..errors import QuadrantsTypeError
from ..lowering import subscripts
from ..typing.field import FieldType
from .base import argument_of, try_static

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
