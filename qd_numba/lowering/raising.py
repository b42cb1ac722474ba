"""Raising a Python exception from compiled kernel code, on every target.

On the CPU, Numba's calling convention carries the exception (class, arguments, location)
from any callee to the kernel's caller. numba-cuda's carries only an integer status code, and
each compiled function numbers its exceptions from 1: a code raised in a device function
(a field ``setitem`` overload, say) means another exception in the kernel that propagates it.
So on CUDA qd_numba raises with its own codes, at or above :data:`DEVICE_CODE_BASE`, which the
launcher decodes with :func:`device_exception` whichever function raised them. A code is a hash
of the exception's class and arguments, so it is the same in every process: compiled code stays
valid in another process (the disk cache), which re-registers what it loads with
:func:`register_device_code`.

:func:`assert_failed` is what a failed ``assert`` calls in debug mode (passes/asserts.py).
"""

from __future__ import annotations

import hashlib
import threading

from numba.core import cgutils, types
from numba.core.imputils import lower_constant
from numba.extending import intrinsic, models, register_model, typeof_impl

from ..errors import QuadrantsAssertionError

DEVICE_CODE_BASE = 1 << 20
_CODE_SPACE = (1 << 31) - DEVICE_CODE_BASE   # codes are positive int32 values
_table: dict = {}                             # code -> (exception class, args, location)
_lock = threading.Lock()


def call_conv(context):
    """The calling convention of the function being lowered: numba-cuda keeps it on the function
    descriptor (its ``context.call_conv`` is deprecated), Numba's CPU target on the context."""
    conv = getattr(getattr(context, "fndesc", None), "call_conv", None)
    return conv if conv is not None else context.call_conv


def _codes_only(conv) -> bool:
    if not type(conv).__module__.startswith("numba.cuda"):
        return False
    from numba.cuda.core.callconv import MinimalCallConv

    return isinstance(conv, MinimalCallConv)


def device_code(exc: type, args: tuple) -> int:
    """The status code of ``exc(*args)``: a stable hash of the class's qualified name and the
    arguments' reprs (the same in every process)."""
    text = f"{exc.__module__}.{exc.__qualname__}{args!r}".encode()
    code = DEVICE_CODE_BASE + int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") % _CODE_SPACE
    register_device_code(code, exc, args)
    return code


def register_device_code(code: int, exc: type, args: tuple) -> None:
    """Make ``code`` decode to ``exc(*args)`` in this process."""
    with _lock:
        known = _table.setdefault(code, (exc, args, None))
    if known[:2] != (exc, args):
        raise RuntimeError(f"internal error: device exception code {code} of {exc.__name__}{args!r} "
                           f"collides with {known[0].__name__}{known[1]!r}")


def device_exception(code: int):
    """(exception class, args, location) of a code from :func:`device_code`, else None."""
    return _table.get(code)


def raise_recorded(kernel, rt, error_words, task_of) -> None:
    """After a debug launch on a GPU: raise the first exception a thread of some task recorded in
    its error word (``error_words``: (launch, device address) pairs; ``task_of(launch)`` its
    Task), naming the kernel and the task. Every word is cleared: the tasks after a failing one
    still ran (their own checks keep them in bounds), and what they recorded must not surface at
    the next call. ``rt`` reads and writes device int32s (the CUDA and HIP runtimes)."""
    recorded = []
    for launch, address in error_words:
        code = rt.read_i32(address)
        if code:
            rt.write_i32(address, 0)
            recorded.append((launch, code))
    if not recorded:
        return
    launch, code = recorded[0]
    cls, exc_args, loc = device_exception(code) or launch.binary.exceptions.get(
        code, (SystemError, (f"unknown error {code} in native function",), None))
    # numba-cuda's own raises carry their line; qd_numba's bounds checks name the task, whose
    # location is its loop (or serial region)
    task = task_of(launch)
    line = f"{loc[1]}:{loc[2]}" if loc else task.loc
    where = f" (task {task.name}" + (f", {line}" if line else "") + ")"
    err = kernel.runtime_error(cls(*exc_args) if exc_args else cls())
    raise type(err)(f"{err}{where}") from None


def raise_user_error(context, builder, exc: type, args: tuple) -> None:
    """Emit ``raise exc(*args)`` at the builder's position (the current block ends)."""
    conv = call_conv(context)
    if _codes_only(conv):
        conv._return_errcode_raw(builder, device_code(exc, args))
    else:
        conv.return_user_exc(builder, exc, args)


class AssertMessage:
    """The message of a failed ``assert``, a compile-time constant: ``template.format(*values)``
    where the values are the f-string's, known at run time; ``names`` are their source
    expressions, shown in their place where values cannot travel (CUDA status codes)."""

    def __init__(self, template: str, names: tuple):
        self.template, self.names = template, tuple(names)

    def static_text(self) -> str:
        return self.template.format(*(f"{{{name}}}" for name in self.names))

    def __deepcopy__(self, memo):
        return self


class AssertMessageType(types.Dummy):
    def __init__(self, message: AssertMessage):
        self.message = message
        super().__init__(name=f"qd.assert_message({message.template!r}, {message.names})")

    @property
    def key(self):
        return self.message.template, self.message.names


@typeof_impl.register(AssertMessage)
def _typeof_assert_message(val, c):
    return AssertMessageType(val)


register_model(AssertMessageType)(models.OpaqueModel)


@lower_constant(AssertMessageType)
def _lower_assert_message(context, builder, ty, pyval):
    return context.get_dummy_value()


_STAR = (types.StarArgTuple, types.StarArgUniTuple)


@intrinsic
def assert_failed(typingctx, message, *values):
    """Raise ``QuadrantsAssertionError`` with ``message`` formatted with ``values`` (numbers
    and booleans are formatted on the host; on CUDA, and for other values, their source
    expressions stand in)."""
    if len(values) == 1 and isinstance(values[0], _STAR):
        values = tuple(values[0])
    if not isinstance(message, AssertMessageType):
        return None
    msg = message.message
    dynamic = bool(values) and all(isinstance(t, (types.Number, types.Boolean)) for t in values)

    def codegen(context, builder, sig, llargs):
        tys = sig.args[1:]
        vals = llargs[1:]
        if len(tys) == 1 and isinstance(tys[0], _STAR):
            tys, vals = tuple(tys[0]), cgutils.unpack_tuple(builder, vals[0], len(tys[0]))
        conv = call_conv(context)
        with cgutils.if_unlikely(builder, cgutils.true_bit):
            if dynamic and not _codes_only(conv):
                conv.return_dynamic_user_exc(builder, QuadrantsAssertionError, (msg.template, *vals),
                                             (None, *tys))
            else:
                raise_user_error(context, builder, QuadrantsAssertionError, (msg.static_text(),))
        return context.get_dummy_value()

    return types.none(message, types.StarArgTuple.from_types(values)), codegen
