"""Compiled helpers of adstacks: per-thread stacks of the values a reverse task replays.

passes/autodiff.py emits calls to these intrinsics in a gradient task whose body has loops
(adstack.py, the runtime side, sizes and owns the memory):

* ``ad_stack_open(desc)``: this thread's stack, ``(base address, depth, flag address, stride)``
  as an int64 4-tuple: word k is at ``base + k * stride``. ``desc`` is the task's descriptor
  field, int64 ``[heap address, depth in words, rows, overflow flag]``; the row is the thread's
  slot (CUDA: the global thread index; CPU: Numba's thread id in the parallel region). On CUDA
  the heap is interleaved (word k of thread t at ``k * rows + t``: the threads of a warp push to
  consecutive addresses, one coalesced access); on the CPU a thread's words are contiguous (no
  cache line shared between threads). A thread without a row gets depth 0 (every push
  overflows, so the launch reports it);
* ``ad_push(stack, top, value)``: stores ``value`` (one 8-byte word: floats widened to f64,
  integers and booleans to i64) at ``top`` and returns ``top + 1``; past the depth it stores
  nothing and sets the overflow flag. Values that are not scalars (iterators, ranges, tuples)
  take no word: ``top`` comes back unchanged;
* ``ad_pop_top(top, like)``: ``top - 1``, or ``top`` for what ``ad_push`` does not store;
* ``ad_pop(stack, top, like)``: the word at ``top`` as ``like``'s type (``like`` itself for
  what ``ad_push`` does not store, and past the depth);
* ``ad_overflowed(stack, top)``: whether pushes went past the depth (the reverse is skipped).

Intrinsics, not ``@overload``: nothing goes through Numba's dispatcher (see lowering/spaces.py).
"""

from __future__ import annotations

from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic

from ..typing.field import FieldType
from ..typing.matrix import MatrixType
from .array_struct import array_struct
from .device import _sreg, is_cuda_context

_I64 = llir.IntType(64)
STACK = types.UniTuple(types.int64, 4)


def _storable(ty) -> bool:
    if isinstance(ty, MatrixType):
        raise TypingError("kernel.grad: a vector or matrix local that changes inside a loop of a parallel loop "
                          "cannot be differentiated yet (adstacks hold scalars); use scalar locals")
    return isinstance(ty, (types.Float, types.Integer, types.Boolean))


def _thread_slot(context, builder):
    if is_cuda_context(context):
        return builder.add(builder.mul(_sreg(builder, "ctaid.x"), _sreg(builder, "ntid.x")), _sreg(builder, "tid.x"))
    # int get_thread_id(void) of Numba's threading layer (declared as it is: the upper half of a
    # 64-bit return register is undefined)
    fn = cgutils.get_or_insert_function(builder.module, llir.FunctionType(llir.IntType(32), []), "get_thread_id")
    return builder.sext(builder.call(fn, []), _I64)


@intrinsic
def ad_stack_open(typingctx, desc):
    if isinstance(desc, FieldType):
        arrty = desc.array_type
    elif isinstance(desc, types.Array):
        arrty = desc
    else:
        return None
    if arrty.dtype != types.int64:
        return None

    def codegen(context, builder, sig, args):
        arr = cgutils.create_struct_proxy(desc)(context, builder, value=args[0]).arr \
            if isinstance(desc, FieldType) else args[0]
        data = array_struct(context, builder, arrty, arr).data
        words = [builder.load(builder.gep(data, [_I64(k)])) for k in range(3)]
        heap, depth, rows = words
        slot = _thread_slot(context, builder)
        has_row = builder.icmp_unsigned("<", slot, rows)
        row = builder.select(has_row, slot, _I64(0))
        if is_cuda_context(context):    # interleaved: word k of thread t at k * rows + t
            base, stride = builder.add(heap, builder.mul(row, _I64(8))), builder.mul(rows, _I64(8))
        else:                           # a row per thread
            base, stride = builder.add(heap, builder.mul(row, builder.mul(depth, _I64(8)))), _I64(8)
        depth = builder.select(has_row, depth, _I64(0))
        flag = builder.ptrtoint(builder.gep(data, [_I64(3)]), _I64)
        return context.make_tuple(builder, STACK, [base, depth, flag, stride])

    return STACK(desc), codegen


def _word(context, builder, ty, value):
    if isinstance(ty, types.Float):
        return builder.bitcast(context.cast(builder, value, ty, types.float64), _I64)
    if isinstance(ty, types.Boolean):
        return builder.zext(context.cast(builder, value, ty, types.boolean), _I64)
    return context.cast(builder, value, ty, types.int64)


def _from_word(context, builder, ty, word):
    if isinstance(ty, types.Float):
        return context.cast(builder, builder.bitcast(word, llir.DoubleType()), types.float64, ty)
    if isinstance(ty, types.Boolean):
        return builder.icmp_unsigned("!=", word, _I64(0))
    return context.cast(builder, word, types.int64, ty)


def _slot_ptr(builder, stack, top):
    base, depth, flag, stride = (builder.extract_value(stack, k) for k in range(4))
    inside = builder.and_(builder.icmp_signed("<", top, depth), builder.icmp_signed(">=", top, _I64(0)))
    ptr = builder.inttoptr(builder.add(base, builder.mul(top, stride)), _I64.as_pointer())
    return inside, ptr, builder.inttoptr(flag, _I64.as_pointer())


@intrinsic
def ad_push(typingctx, stack, top, value):
    value = types.unliteral(value)
    storable = _storable(value)

    def codegen(context, builder, sig, args):
        top_v = context.cast(builder, args[1], sig.args[1], types.int64)
        if not storable:
            return top_v
        inside, ptr, flag = _slot_ptr(builder, args[0], top_v)
        with builder.if_else(inside) as (store, overflow):
            with store:
                builder.store(_word(context, builder, value, args[2]), ptr)
            with overflow:
                builder.store(_I64(1), flag)
        return builder.add(top_v, _I64(1))

    return types.int64(stack, top, value), codegen


@intrinsic
def ad_pop(typingctx, stack, top, like):
    like = types.unliteral(like)
    storable = _storable(like)

    def codegen(context, builder, sig, args):
        if not storable:    # the same value: a new reference for the caller (arrays are refcounted)
            return impl_ret_borrowed(context, builder, like, args[2])
        top_v = context.cast(builder, args[1], sig.args[1], types.int64)
        inside, ptr, _ = _slot_ptr(builder, args[0], top_v)
        out = cgutils.alloca_once_value(builder, args[2])
        with builder.if_then(inside):
            builder.store(_from_word(context, builder, like, builder.load(ptr)), out)
        return builder.load(out)

    return like(stack, top, like), codegen


@intrinsic
def ad_pop_top(typingctx, top, like):
    storable = _storable(types.unliteral(like))

    def codegen(context, builder, sig, args):
        top_v = context.cast(builder, args[0], sig.args[0], types.int64)
        return builder.sub(top_v, _I64(1)) if storable else top_v

    return types.int64(top, like), codegen


@intrinsic
def ad_overflowed(typingctx, stack, top):
    def codegen(context, builder, sig, args):
        top_v = context.cast(builder, args[1], sig.args[1], types.int64)
        return builder.icmp_signed(">", top_v, builder.extract_value(args[0], 1))

    return types.boolean(stack, top), codegen
