"""TypeFloatLiterals: a Python float in a kernel is a constant of ``default_fp``, as in Quadrants.

Input: the kernel's IR after every other pass (qd.func bodies inlined, ``qd.static`` loops
unrolled, adjoints built), so each copy of a literal is reached. Output: every constant,
global or free variable whose value is a Python ``float`` holds a
:class:`~qd_numba.typing.literals.FloatLiteralValue` of ``default_fp`` instead, which Numba
types as a ``FloatLiteral`` (typing/literals.py: ``f32 op 0.9`` is f32, ``int op 0.9`` is
``default_fp``, ``f64 op 0.1`` uses the exact f64 ``0.1``). Nothing else is touched; numpy
scalars (``np.float64(0.1)``) keep their own type. With ``default_fp=qd.f16`` literals are f32.
"""

from __future__ import annotations

from numba.core import types

from ..lowering import literals as _lowering_literals  # noqa: F401  (registers the lowering)
from ..typing.literals import FloatLiteralValue


class TypeFloatLiterals:
    name = "type_float_literals"

    def run(self, state) -> bool:
        ir = state.ir
        # f16 values compute in f32 in compiled code (Numba has no f16 scalar on the CPU)
        fp = types.float32 if state.config.default_fp == types.float16 else state.config.default_fp
        changed = False
        for block in state.func_ir.blocks.values():
            for stmt in block.body:
                if isinstance(stmt, ir.Assign) and isinstance(stmt.value, (ir.Const, ir.Global, ir.FreeVar)) \
                        and type(stmt.value.value) is float:
                    stmt.value.value = FloatLiteralValue(stmt.value.value, fp)
                    changed = True
        return changed
