"""Compiled helpers of passes/sparse.py (sparse SNodes).

A bitmasked or pointer node's cell state (snode.py) is 0 (inactive, not listed), 1 (active,
listed) or 2 (inactive, still listed): the list of a node's cells that were active since its last
``deactivate_all`` grows by one atomic append per 0 -> 1 change, so struct-fors walk that list
instead of every cell. A pointer node's blocks come from a ring of free blocks and go back to it
when a cell is deactivated (``take_block``, ``free_block``).
"""

from __future__ import annotations

from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

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


@intrinsic
def memory_fence(typingctx):
    """Order this thread's memory accesses before and after it for every thread of the launch
    (a block given back is zeroed before another thread may take it and write it)."""
    def codegen(context, builder, sig, args):
        from .device import is_cuda_context

        if is_cuda_context(context):
            fn = cgutils.get_or_insert_function(builder.module, llir.FunctionType(llir.VoidType(), []),
                                                "llvm.nvvm.membar.gl")
            builder.call(fn, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.none(), codegen


def activate_block(flags, cells, count, slots, ring, heads, idx, flat, capacity):
    """``activate_cell`` for a pointer node: the thread that makes the cell active gives it a block
    of the pool (``take_block``) unless it kept one; a thread that finds the cell active but its
    block not yet given waits for it."""
    raise NotImplementedError("compiled code only")


@overload(activate_block)
def _activate_block(flags, cells, count, slots, ring, heads, idx, flat, capacity):
    if not isinstance(flags, FieldType):
        return None

    def impl(flags, cells, count, slots, ring, heads, idx, flat, capacity):
        if flags[idx] != 1:
            old = element_cas(flags, idx, 0, 1)
            take = old == 0
            if take:
                cells[element_atomic(count, None, 1, "add")] = flat
            elif old == 2:
                take = element_cas(flags, idx, 2, 1) == 2
            if take and slots[idx] == 0:    # (a cell made inactive through a parent keeps its block)
                element_atomic(slots, idx, take_block(ring, heads, capacity) + 1, "xchg")
        if slots[idx] == 0:
            while element_atomic(slots, idx, 0, "add") == 0:
                pass
        return 0
    return impl


def take_block(ring, heads, capacity):
    """A free block of a pointer node's pool: the ring ``ring`` of free blocks is read at
    ``heads[0]`` (taken, atomically) while below ``heads[1]`` (given back); a position given back
    but not yet written (-1) is waited for. None left: the spare block ``capacity + 1``, counted
    in ``heads[2]`` (the host reports the overflow)."""
    raise NotImplementedError("compiled code only")


@overload(take_block)
def _take_block(ring, heads, capacity):
    if not isinstance(ring, FieldType):
        return None

    def impl(ring, heads, capacity):
        h = element_atomic(heads, 0, 1, "add")
        if h >= element_atomic(heads, 1, 0, "add"):
            element_atomic(heads, 2, 1, "add")
            return capacity + 1
        k = h % capacity
        block = element_atomic(ring, k, -1, "xchg")
        while block == -1:
            block = element_atomic(ring, k, -1, "xchg")
        memory_fence()
        return block
    return impl


def free_block(flags, slots, ring, heads, idx, capacity):
    """Make the cell ``idx`` of a pointer node inactive (state 2: it stays listed) and give its
    block back to the ring (its data was zeroed first): the next activation of any cell may take it."""
    raise NotImplementedError("compiled code only")


@overload(free_block)
def _free_block(flags, slots, ring, heads, idx, capacity):
    if not isinstance(flags, FieldType):
        return None

    def impl(flags, slots, ring, heads, idx, capacity):
        if element_cas(flags, idx, 1, 2) == 1:
            slot = element_atomic(slots, idx, 0, "xchg")
            if 0 < slot <= capacity:
                memory_fence()
                t = element_atomic(heads, 1, 1, "add")
                element_atomic(ring, t % capacity, slot - 1, "xchg")
        return 0
    return impl


def set_flag(flags, idx, value):
    """A cell of a bitmasked node below a pointer node (its states live in the pointer's block
    and it has no list of its own): state ``value`` (1 active, 0 not)."""
    raise NotImplementedError("compiled code only")


@overload(set_flag)
def _set_flag(flags, idx, value):
    if not isinstance(flags, FieldType):
        return None

    def impl(flags, idx, value):
        if flags[idx] != value:
            flags[idx] = value
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
