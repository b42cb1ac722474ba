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
"""

from __future__ import annotations

import hashlib
import threading

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


def raise_user_error(context, builder, exc: type, args: tuple) -> None:
    """Emit ``raise exc(*args)`` at the builder's position (the current block ends)."""
    conv = call_conv(context)
    if _codes_only(conv):
        conv._return_errcode_raw(builder, device_code(exc, args))
    else:
        conv.return_user_exc(builder, exc, args)
