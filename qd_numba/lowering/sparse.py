"""Compiled helpers of passes/sparse.py (sparse SNodes).

A bitmasked or pointer node's cell state (snode.py) is 0 (inactive, not listed), 1 (active,
listed) or 2 (inactive, still listed): the list of a node's cells that were active since its last
``deactivate_all`` grows by one atomic append per 0 -> 1 change, so struct-fors walk that list
instead of every cell.
"""

from __future__ import annotations

from numba.extending import overload

from ..typing.field import FieldType
from .atomic_cas import element_cas
from .field import element_atomic


def activate_cell(flags, cells, count, idx, flat):
    """Make the cell ``idx`` (``flat`` in C order) of a node active: a compare-and-swap of its
    state; the thread that changes it from 0 appends ``flat`` to the node's list of cells."""
    raise NotImplementedError("compiled code only")


@overload(activate_cell)
def _activate_cell(flags, cells, count, idx, flat):
    if not isinstance(flags, FieldType):
        return None

    def impl(flags, cells, count, idx, flat):
        if flags[idx] != 1:
            old = element_cas(flags, idx, 0, 1)
            if old == 0:
                cells[element_atomic(count, None, 1, "add")] = flat
            elif old == 2:
                element_cas(flags, idx, 2, 1)
        return 0
    return impl


def activate_block(flags, cells, count, slots, idx, flat, capacity):
    """``activate_cell`` for a pointer node: the thread that lists the cell also gives it the
    pool's next block (its position in the list; past ``capacity``: the spare block
    ``capacity + 1``, and the host reports the overflow); a thread that finds the cell active
    but its block not yet given waits for it."""
    raise NotImplementedError("compiled code only")


@overload(activate_block)
def _activate_block(flags, cells, count, slots, idx, flat, capacity):
    if not isinstance(flags, FieldType):
        return None

    def impl(flags, cells, count, slots, idx, flat, capacity):
        if flags[idx] != 1:
            old = element_cas(flags, idx, 0, 1)
            if old == 0:
                q = element_atomic(count, None, 1, "add")
                cells[q] = flat
                element_atomic(slots, idx, q + 1 if q < capacity else capacity + 2, "xchg")
            elif old == 2:
                element_cas(flags, idx, 2, 1)
        if slots[idx] == 0:
            while element_atomic(slots, idx, 0, "add") == 0:
                pass
        return 0
    return impl


def deactivate_cell(flags, idx):
    """Make the cell ``idx`` inactive; it stays in the node's list (state 2)."""
    raise NotImplementedError("compiled code only")


@overload(deactivate_cell)
def _deactivate_cell(flags, idx):
    if not isinstance(flags, FieldType):
        return None

    def impl(flags, idx):
        element_cas(flags, idx, 1, 2)
        return 0
    return impl


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


def unlist_block(target, start, size):
    """In the same block of a nested bitmasked/pointer node's states, set those not 0 to 2 (the
    cells become inactive and stay listed)."""
    raise NotImplementedError("compiled code only")


@overload(zero_block)
def _zero_block(target, start, size):
    if not isinstance(target, FieldType) or len(start) > 4:
        return None

    def impl(target, start, size):
        for flat in range(_block_total(size)):
            target[_block_index(start, size, flat)] = 0
        return 0
    return impl


@overload(unlist_block)
def _unlist_block(target, start, size):
    if not isinstance(target, FieldType) or len(start) > 4:
        return None

    def impl(target, start, size):
        for flat in range(_block_total(size)):
            idx = _block_index(start, size, flat)
            if target[idx] != 0:
                target[idx] = 2
        return 0
    return impl


def _block_total(size):
    raise NotImplementedError("compiled code only")


@overload(_block_total)
def _block_total_impl(size):
    def impl(size):
        total = 1
        for n in size:
            total *= n
        return total
    return impl


def _block_index(start, size, flat):
    raise NotImplementedError("compiled code only")


@overload(_block_index)
def _block_index_impl(start, size, flat):
    ndim = len(start)
    if ndim == 1:
        return lambda start, size, flat: start[0] + flat
    if ndim == 2:
        return lambda start, size, flat: (start[0] + flat // size[1], start[1] + flat % size[1])
    if ndim == 3:
        return lambda start, size, flat: (start[0] + flat // (size[1] * size[2]),
                                          start[1] + flat // size[2] % size[1], start[2] + flat % size[2])
    if ndim == 4:
        return lambda start, size, flat: (start[0] + flat // (size[1] * size[2] * size[3]),
                                          start[1] + flat // (size[2] * size[3]) % size[1],
                                          start[2] + flat // size[3] % size[2], start[3] + flat % size[3])
    return None
