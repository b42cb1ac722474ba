"""``qd.volatile_load(x[i])``: read one element of a field or ndarray with volatile semantics.

The compiler may not cache, hoist or merge the read with other reads of the same address, so a
spin-wait such as ``while qd.volatile_load(flags[prev]) == 0: pass`` sees another thread's
store on every iteration (as Quadrants' ``qd.volatile_load``).

* ``volatile_load`` is a marker, like the atomics: passes/rewrite_subscripts.py rewrites
  ``qd.volatile_load(G[I])`` (``G`` a field or ndarray, ``I`` an element index) into
  ``volatile_element_load(G, I)``. Anything else as its argument is a ``QuadrantsSyntaxError``
  there: a field or ndarray not indexed (Quadrants: "index it first"), a local value (no other
  thread can write it), a component ``G[I][J]``.
* ``volatile_element_load`` lowers to LLVM ``load volatile`` of each component of the element
  (a vector element loads all its components), on the CPU and on CUDA, where NVVM emits
  ``ld.volatile.global``. A checked field (``debug=True``) is bounds-checked as any load.

The read is not an ordinary load for the optimisations either: passes/cfg_optimize.py treats
the call as a barrier (nothing is forwarded into it) and passes/accesses.py as an unknown use of
the resource (no fusion across it).
"""

from __future__ import annotations

from llvmlite import ir as llir
from numba.core import types
from numba.extending import intrinsic, overload

from ..errors import QuadrantsSyntaxError
from ..lowering import field as field_impl
from ..lowering.matrix import matrix_from_tuple
from ..lowering.subscripts import as_index_tuple
from ..typing.field import FieldType


def volatile_load(target):
    """Read ``target``, an element of a field or ndarray (``x[i]``), with volatile semantics."""
    raise QuadrantsSyntaxError("qd.volatile_load can only be used inside a kernel or func")


def volatile_element_load(base, index):
    """``base[index]`` read with ``load volatile`` (compiled code only)."""
    raise QuadrantsSyntaxError("volatile_element_load is compiled code only")


class _VolatileLoad(llir.LoadInstr):
    """llvmlite's ``load`` printed as ``load volatile`` (llvmlite has no flag for it)."""

    def descr(self, buf):
        before = len(buf)
        super().descr(buf)
        buf[before] = buf[before].replace("load ", "load volatile ", 1)


def _load_volatile(context, builder, ty, ptr):
    """One element component read volatile, as the value dtype (f16 bits widen to f32)."""
    half = field_impl._is_half(ty)
    dtype = types.uint16 if half else field_impl._layout(ty)[0]
    instr = _VolatileLoad(builder.block, ptr, typ=context.get_data_type(dtype))
    builder._insert(instr)
    if half:
        return builder.fpext(builder.bitcast(instr, llir.HalfType()), llir.FloatType())
    return context.data_model_manager[dtype].from_data(builder, instr)


@intrinsic
def _volatile_element_load(typingctx, f, idx):
    if field_impl._layout(f) is None:
        return None
    field_impl.check_index(f, idx, "read")
    resty = field_impl._value_type(f)

    def codegen(context, builder, sig, args):
        ptrs = field_impl._component_pointers(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        loaded = [_load_volatile(context, builder, sig.args[0], p) for p in ptrs]
        if isinstance(sig.return_type, types.BaseTuple):
            return context.make_tuple(builder, sig.return_type, loaded)
        return loaded[0]

    return resty(f, idx), codegen


@overload(volatile_element_load)
def _volatile_element_load_overload(base, index):
    if not isinstance(base, (FieldType, types.Array)):
        return None
    elem = base.value_elem_type if isinstance(base, FieldType) else None
    if elem is None:
        return lambda base, index: _volatile_element_load(base, as_index_tuple(index))
    return lambda base, index: matrix_from_tuple(_volatile_element_load(base, as_index_tuple(index)), elem)
