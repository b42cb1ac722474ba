"""The kernel that ``qd.ad.Tape(validation=True)`` runs instead of a recorded one.

Runs only in a compile with ``state.autodiff_mode == "validation"``, after PlanTasks: after
every read of an element of a field with a gradient it stores 1 at the same index of the
field's *read mask* (:func:`read_mask`, an i32 field of the same shape and offset). The Tape
(ad.py) zeroes the masks before the call and keeps, with its snapshot of the field, the elements
the call read; a later change of one of those elements is an overwrite that makes the gradient
wrong. Elements the call did not read may change (a time axis: ``x[t + 1, i] = f(x[t, i])``).
"""

from __future__ import annotations

from .. import dtypes
from ..field import Field
from .base import hidden_argument, is_global_data, try_static
from .plan_tasks import PlanTasks


def read_mask(field) -> Field:
    """The read mask of ``field`` (made on first use; it lives as long as the field)."""
    mask = getattr(field, "_read_mask", None)
    if mask is None:
        mask = Field(dtypes.i32, field.shape, name=f"{field.name or 'field'}.read_mask", offset=field.offset)
        field._read_mask = mask
    return mask


class RecordReads:
    name = "ad_validation"

    def run(self, state) -> bool:
        if getattr(state, "autodiff_mode", None) != "validation":
            return False
        ir = state.ir
        binds, changed = [], False
        for block in list(state.func_ir.blocks.values()):
            out = []
            for stmt in block.body:
                out.append(stmt)
                value = stmt.value if isinstance(stmt, ir.Assign) else None
                if not isinstance(value, ir.Expr) or value.op not in ("getitem", "static_getitem") \
                        or not is_global_data(state, value.value):
                    continue
                field = try_static(state, value.value)
                if not isinstance(field, Field) or field.grad is None:
                    continue
                mask = hidden_argument(state, read_mask(field), stmt.loc, binds)
                one = block.scope.redefine("$qd_read", stmt.loc)
                out.append(ir.Assign(ir.Const(1, stmt.loc), one, stmt.loc))
                if value.op == "getitem":
                    out.append(ir.SetItem(mask, value.index, one, stmt.loc))
                else:
                    out.append(ir.StaticSetItem(mask, value.index, value.index_var, one, stmt.loc))
                changed = True
            block.body = out
        if not changed:
            return False
        entry = state.func_ir.blocks[min(state.func_ir.blocks)]
        entry.body[:0] = binds
        state.refresh_definitions()
        PlanTasks().run(state)
        return True
