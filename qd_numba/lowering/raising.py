"""Raising a Python exception from compiled kernel code, on every target.

On the CPU, Numba's calling convention carries the exception (class, arguments, location)
from any callee to the kernel's caller. numba-cuda's carries only an integer status code, and
each compiled function numbers its exceptions from 1: a code raised in a device function
(a field ``setitem`` overload, say) means another exception in the kernel that propagates it.
So on CUDA qd_numba raises with process-wide codes from :data:`DEVICE_CODE_BASE` up, which
the launcher decodes with :func:`device_exception` whichever function raised them.
"""

from __future__ import annotations

import threading

DEVICE_CODE_BASE = 1 << 20
_codes: dict = {}
_table: list = []
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
    """The process-wide status code of ``exc(*args)``."""
    key = (exc, args)
    with _lock:
        code = _codes.get(key)
        if code is None:
            code = _codes[key] = DEVICE_CODE_BASE + len(_table)
            _table.append((exc, args, None))
    return code


def device_exception(code: int):
    """(exception class, args, location) of a code from :func:`device_code`, else None."""
    index = code - DEVICE_CODE_BASE
    return _table[index] if 0 <= index < len(_table) else None


def raise_user_error(context, builder, exc: type, args: tuple) -> None:
    """Emit ``raise exc(*args)`` at the builder's position (the current block ends)."""
    conv = call_conv(context)
    if _codes_only(conv):
        conv._return_errcode_raw(builder, device_code(exc, args))
    else:
        conv.return_user_exc(builder, exc, args)
