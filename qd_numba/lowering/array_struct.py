"""The LLVM struct of a Numba array value, for lowering code that builds or reads one."""

from __future__ import annotations

from numba.core import cgutils, types


def array_struct(context, builder, arrty, value=None, ref=None):
    """``context.make_array(arrty)(context, builder, value, ref)`` without its ``__array__``
    lookup where ``arrty`` is a plain ``types.Array``: ``make_array`` asks the target context
    for an ``__array__`` implementation on every use, which a plain array never has, and every
    miss refreshes all of the context's registries (the same struct, ~3 refreshes per task)."""
    if type(arrty) is types.Array:
        return cgutils.create_struct_proxy(arrty)(context, builder, value=value, ref=ref)
    return context.make_array(arrty)(context, builder, value=value, ref=ref)


_ABI_SIZES: dict = {}


def abi_sizeof(context, llty) -> int:
    """``context.get_abi_sizeof(llty)``, remembered per target context class and type: llvmlite
    answers it by building and parsing an LLVM module (~0.25 ms a call, per field a task reads)."""
    key = (type(context), str(llty))
    size = _ABI_SIZES.get(key)
    if size is None:
        size = _ABI_SIZES[key] = context.get_abi_sizeof(llty)
    return size
