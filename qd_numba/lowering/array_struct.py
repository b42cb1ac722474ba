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
    answers it by building and parsing an LLVM module (~0.1-0.25 ms a call). A type naming an
    identified struct (``%"name"``) is not remembered: its name does not say its body."""
    text = str(llty)
    key = (type(context), text)
    size = _ABI_SIZES.get(key)
    if size is None:
        size = type(context).get_abi_sizeof(context, llty)
        if "%" not in text:
            _ABI_SIZES[key] = size
    return size


def remember_abi_sizes(context) -> None:
    """Make ``context.get_abi_sizeof`` remember its answers (:func:`abi_sizeof`). Numba's
    lowering asks it for every user variable of every function it lowers (for debug info, also
    when there is none): one LLVM module parsed per variable, ~5% of a task's lowering."""
    if "get_abi_sizeof" not in vars(context):
        context.get_abi_sizeof = lambda llty: abi_sizeof(context, llty)
