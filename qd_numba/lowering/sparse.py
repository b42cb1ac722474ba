"""Compiled helpers of passes/sparse.py (sparse SNodes)."""

from __future__ import annotations

from numba.extending import overload

from ..typing.field import FieldType


def store_if(target, index, value, ok):
    """``target[index] = value`` when ``ok`` (``qd.append`` within a dynamic node's capacity)."""
    raise NotImplementedError("compiled code only")


@overload(store_if)
def _store_if(target, index, value, ok):
    if not isinstance(target, FieldType):
        return None

    def impl(target, index, value, ok):
        if ok:
            target[index] = value
        return 0
    return impl
