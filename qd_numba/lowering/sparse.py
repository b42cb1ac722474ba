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


def zero_block(target, start, size):
    """Zero ``target``'s elements ``start[k] <= i_k < start[k] + size[k]`` (a deactivated cell)."""
    raise NotImplementedError("compiled code only")


@overload(zero_block)
def _zero_block(target, start, size):
    if not isinstance(target, FieldType):
        return None
    ndim = len(start)
    if ndim == 1:
        def impl(target, start, size):
            for a in range(size[0]):
                target[start[0] + a] = 0
            return 0
    elif ndim == 2:
        def impl(target, start, size):
            for a in range(size[0]):
                for b in range(size[1]):
                    target[start[0] + a, start[1] + b] = 0
            return 0
    elif ndim == 3:
        def impl(target, start, size):
            for a in range(size[0]):
                for b in range(size[1]):
                    for c in range(size[2]):
                        target[start[0] + a, start[1] + b, start[2] + c] = 0
            return 0
    elif ndim == 4:
        def impl(target, start, size):
            for a in range(size[0]):
                for b in range(size[1]):
                    for c in range(size[2]):
                        for d in range(size[3]):
                            target[start[0] + a, start[1] + b, start[2] + c, start[3] + d] = 0
            return 0
    else:
        return None
    return impl
