"""The exceptions qd_numba raises, with Quadrants' names.

Every error derives from :class:`QuadrantsError`. Compile-time errors also derive
from the matching builtin (``QuadrantsSyntaxError`` is a ``SyntaxError``,
``QuadrantsTypeError`` a ``TypeError``), so user code can catch them either way.

Errors that point at user code carry the kernel name and a ``file:line`` with the
source line; :func:`located` builds that message once, at the failing node.
Set ``QD_RAW_ERRORS=1`` to let Numba's own exceptions through unwrapped.

:class:`QuadrantsWarning` marks code that runs but probably not as meant (a global list read at
a constant index is frozen at compile time); docs/guide/errors.md lists them.
"""

from __future__ import annotations

import linecache
import threading


class QuadrantsError(Exception):
    """Base class of every qd_numba error."""


class QuadrantsCompilationError(QuadrantsError):
    """A kernel or func could not be compiled."""


class QuadrantsSyntaxError(QuadrantsCompilationError, SyntaxError):
    """A Python construct that kernels do not support."""


class QuadrantsNameError(QuadrantsCompilationError, NameError):
    """A name in a kernel that cannot be resolved."""


class QuadrantsTypeError(QuadrantsCompilationError, TypeError):
    """Wrong types: at a kernel call (argument checks) or inside a kernel."""


class QuadrantsIndexError(QuadrantsCompilationError, IndexError):
    """Indexing a field or ndarray with the wrong number of indices."""


class QuadrantsRuntimeError(QuadrantsError, RuntimeError):
    """An error while a kernel runs (out-of-bounds access in debug mode, no device, ...)."""


class QuadrantsRuntimeTypeError(QuadrantsRuntimeError, TypeError):
    """A value that cannot be converted to the type a kernel argument or return value needs
    (Quadrants' name; :meth:`get` and :meth:`get_ret` build its two messages)."""

    @staticmethod
    def get(pos, needed, provided) -> QuadrantsRuntimeTypeError:
        return QuadrantsRuntimeTypeError(f"Argument {pos} (type={provided}) cannot be converted into required "
                                         f"type {needed}")

    @staticmethod
    def get_ret(needed, provided) -> QuadrantsRuntimeTypeError:
        return QuadrantsRuntimeTypeError(f"Return (type={provided}) cannot be converted into required type {needed}")


class QuadrantsAssertionError(QuadrantsRuntimeError, AssertionError):
    """A failed ``assert`` in a kernel compiled with ``debug=True`` (a runtime error, as in Quadrants).

    Raised from compiled code as ``(template, *values)`` when the assert's f-string message
    has values known only at run time; the message is ``template.format(*values)``."""

    def __str__(self):
        if len(self.args) > 1 and isinstance(self.args[0], str):
            return self.args[0].format(*self.args[1:])
        return super().__str__()


class QuadrantsConfigError(QuadrantsError, TypeError, ValueError):
    """A bad ``qd.init`` option or ``QD_*`` variable, named in the message: an unknown option
    (catchable as ``TypeError``, as Python's own keyword errors) or an invalid value
    (``ValueError``)."""


class QuadrantsWarning(UserWarning):
    """Code that compiles and runs but likely not as meant; silence it with ``warnings.filterwarnings``."""


def source_excerpt(loc) -> str:
    """``file:line`` plus the source line with a caret under its first character."""
    if loc is None or getattr(loc, "filename", None) is None:
        return ""
    line = (getattr(loc, "line", None) or 0)
    text = linecache.getline(loc.filename, line).rstrip("\n") if line else ""
    where = f'  File "{loc.filename}", line {line}'
    if not text.strip():
        return where
    return f"{where}\n    {text.strip()}\n    ^"


def located(exc_type: type[QuadrantsError], message: str, kernel: str | None = None, loc=None) -> QuadrantsError:
    """An exception of ``exc_type`` whose message names the kernel and the source line."""
    head = f"in kernel '{kernel}': {message}" if kernel else message
    excerpt = source_excerpt(loc)
    return exc_type(f"{head}\n{excerpt}" if excerpt else head)


_pending = threading.local()


def typing_error(exc: QuadrantsError) -> QuadrantsError:
    """Remember ``exc`` raised from inside Numba's typing, which wraps it in its own error;
    the kernel compiler re-raises the original (see :func:`take_pending`)."""
    _pending.exc = exc
    return exc


def take_pending() -> QuadrantsError | None:
    exc = getattr(_pending, "exc", None)
    _pending.exc = None
    return exc
