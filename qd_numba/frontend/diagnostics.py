"""Error translation: Numba's frontend, typing and lowering errors become ours, with the kernel's
name, the user's source line and a message without Numba internals — one path for every target
(Numba's CPU pipeline and numba-cuda's copy of it). ``QD_RAW_ERRORS=1`` lets Numba's through.
"""

from __future__ import annotations

import os
import re
import sys

from numba.core import errors as numba_errors

from ..errors import (
    QuadrantsCompilationError,
    QuadrantsError,
    QuadrantsNameError,
    QuadrantsSyntaxError,
    QuadrantsTypeError,
    located,
    take_pending,
)
from ..field import ArrayData, Field
from ..passes.check_writes import is_readonly

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # qd_numba/


def run_frontend(tools, fn, name):
    from ..targets.task_pipeline import lean_post_processing

    try:
        with lean_post_processing(tools.ir.__name__.rsplit(".", 1)[0]):
            return tools.run_frontend(fn)
    except numba_errors.UnsupportedError as e:
        raise QuadrantsSyntaxError(f"in '{name}': unsupported Python construct: {e}") from None
    except Exception as e:
        if not is_numba_error(e):  # Numba's or numba-cuda's
            raise
        if _is_numba_error_class(e, "NotDefinedError"):
            loc = e.loc or _first_read(fn, e.name)   # numba-cuda's frontend gives no location
            raise located(QuadrantsNameError, f"in '{name}': {_unbound_local(fn, e.name)}", loc=loc) from None
        raise QuadrantsSyntaxError(f"in '{name}': {e}") from None


def _first_read(fn, name: str):
    """The location of the first instruction of ``fn`` that reads the local ``name``, or None."""
    import dis

    from numba.core import ir as numba_ir

    line = None
    for ins in dis.get_instructions(fn):
        current = getattr(ins, "line_number", None)     # Python >= 3.13
        if current is None and not isinstance(ins.starts_line, bool):
            current = ins.starts_line                   # Python <= 3.12: the line it starts, or None
        line = current or line
        if ins.opname.startswith("LOAD_FAST") and name in (ins.argval if isinstance(ins.argval, tuple)
                                                         else (ins.argval,)):
            return numba_ir.Loc(fn.__code__.co_filename, line) if line else None
    return None


def _unbound_local(fn, name: str) -> str:
    """What to write instead, when the frontend finds ``name`` read before any assignment: mostly
    ``x += ...`` on a global 0-d field, which Python makes a local variable of the kernel."""
    value = fn.__globals__.get(name)
    if isinstance(value, Field) and value.shape == ():
        return (f"'{name}' is a 0-d field: read and write its value as {name}[None] "
                f"(e.g. {name}[None] += ...); assigning to '{name}' itself makes it a local variable")
    if isinstance(value, ArrayData):
        return (f"assigning to '{name}' makes it a local variable of the kernel; "
                f"write to the elements of the field instead: {name}[i] = ...")
    return (f"local variable '{name}' is read before it is assigned; assigning to a global or enclosing "
            f"variable makes it local to the kernel (for a 0-d field write {name}[None] += ...; kernels "
            "cannot rebind Python variables)")


# -- kernels ---------------------------------------------------------------------------------------------


def source_loc(exc):
    """The innermost user statement Numba was typing or lowering when ``exc`` (not a Numba error,
    so Numba let it through without a location) was raised: the ``loc`` local of its constraint-
    propagation frames, or the statement (``inst``) of its lowering frames (Numba's or numba-cuda's),
    skipping statements of qd_numba's, Numba's and numba-cuda's own code."""


    import numba
    from numba.core import lowering, typeinfer

    compiler_files = {typeinfer.__file__: "loc", lowering.__file__: "inst"}
    internal = [os.path.dirname(numba.__file__) + os.sep, _PACKAGE_DIR + os.sep]
    if "numba.cuda.core.typeinfer" in sys.modules:
        compiler_files[sys.modules["numba.cuda.core.typeinfer"].__file__] = "loc"
        internal.append(os.path.dirname(sys.modules["numba.cuda"].__file__) + os.sep)
    if "numba.cuda.core.lowering" in sys.modules:
        compiler_files[sys.modules["numba.cuda.core.lowering"].__file__] = "inst"
    loc = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        local = compiler_files.get(frame.f_code.co_filename)
        if local is not None:
            candidate = frame.f_locals.get(local)
            candidate = getattr(candidate, "loc", None) if local == "inst" else candidate
            filename = getattr(candidate, "filename", None)
            if filename and hasattr(candidate, "line") \
                    and not os.path.abspath(filename).startswith(tuple(internal)):
                loc = candidate
        tb = tb.tb_next
    return loc


def _raised_by_codegen(exc) -> bool:
    """Raised by qd_numba's typing or lowering code (our Numba extensions), which knows no kernel
    or source line, rather than by a pass (whose errors are located where they are raised)."""


    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    here = _PACKAGE_DIR
    where = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return where.startswith((os.path.join(here, "lowering") + os.sep, os.path.join(here, "typing") + os.sep))


_REPORTED_FILE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _reported_loc(text: str):
    """The user's source location that a Numba report names (numba-cuda's reports carry it only
    in their text): the last ``File "...", line N`` outside Numba and qd_numba, or None."""
    import numba
    from numba.core import ir as numba_ir

    internal = (os.path.dirname(numba.__file__), _PACKAGE_DIR)
    found = None
    for m in _REPORTED_FILE.finditer(_ANSI_ESCAPE.sub("", text)):
        path = m.group("file")
        if not os.path.abspath(path).startswith(internal) and "site-packages" not in path:
            found = numba_ir.Loc(path, int(m.group("line")))
    return found


def is_numba_error(e) -> bool:
    """A Numba error, from Numba's CPU pipeline or numba-cuda's own copy of it."""
    if isinstance(e, numba_errors.NumbaError):
        return True
    cuda_errors = sys.modules.get("numba.cuda.core.errors")
    return cuda_errors is not None and isinstance(e, cuda_errors.NumbaError)


def _is_numba_error_class(e, name: str) -> bool:
    """``e`` is an instance of Numba's error class ``name`` (of either copy of Numba's errors)."""
    return is_numba_error(e) and any(c.__name__ == name for c in type(e).__mro__)


def compile_error(kernel_name, e, param_types, raw_errors: bool, pending_fallback=None):
    """The exception to raise for ``e``, raised while compiling ``kernel_name`` on any target,
    or None to let ``e`` through unchanged. Our errors raised inside Numba's typing or lowering get
    the kernel name and source line; Numba's become ours (``QD_RAW_ERRORS`` keeps them)."""
    if isinstance(e, QuadrantsError):
        # raised inside Numba's typing, which let it through, or by our lowering: not located yet
        if take_pending() is e or _raised_by_codegen(e):
            return located(type(e), str(e), kernel_name, source_loc(e))
        return None
    if raw_errors or not is_numba_error(e):
        return None
    return _wrap_numba_error(kernel_name, e, take_pending() or pending_fallback, param_types)


def _wrap_numba_error(kernel_name, e, pending, param_types=None):
    text = str(e)
    loc = getattr(e, "loc", None) or _reported_loc(text) or source_loc(e)
    if pending is not None:
        return located(type(pending), str(pending), kernel_name, loc)
    readonly = [name for name, ty in (param_types or {}).items() if is_readonly(ty)]
    if readonly and "readonly array" in text:  # a write the CheckReadonlyWrites pass cannot see (a callee)
        names = ", ".join(f"'{n}'" for n in readonly)
        return located(QuadrantsTypeError, f"read-only array argument {names} (numpy flags.writeable is False) "
                       "is written to", kernel_name, loc)
    report = numba_report(text)
    if "qd.field(" in report and "ndim=0" in report:
        report += "\n(a 0-d field holds one value: read and write it as x[None], e.g. x[None] += 1)"
    if _is_numba_error_class(e, "TypingError"):
        err = located(QuadrantsTypeError, report, kernel_name, loc)
    elif _is_numba_error_class(e, "UnsupportedError"):
        err = located(QuadrantsSyntaxError, f"unsupported construct: {report}", kernel_name, loc)
    else:
        err = located(QuadrantsCompilationError, report, kernel_name, loc)
    return type(err)(f"{err}\n(set QD_RAW_ERRORS=1 for Numba's full report)")


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


_NUMBA_NOISE = re.compile(r"(Failed in .* mode pipeline|During: |raised from |<source elided>)")


_NUMBA_SOURCE = re.compile(r'File ".*", line \d+:$')


_NUMBA_NO_IMPL = re.compile(r"No implementation of function .* found for signature:\s*>>> (.*?)\s*There are \d+ "
                            r"candidate implementations", re.S)


_NUMBA_REASON = re.compile(r"raised a specific error:\s*\n\s*(?:\w+(?:Error|Exception): )?(.*)")


def numba_report(text: str) -> str:
    """The part of a Numba error report that speaks about the user's code: without the pipeline
    stages, the compiler's statements and Numba's source excerpt (ours replaces it); a failed
    overload resolution becomes "cannot call f(types): innermost reason". Terminal colours
    (numba-cuda highlights its reports) are removed first."""
    lines, in_source = [], False
    for line in _ANSI_ESCAPE.sub("", text).splitlines():
        stripped = line.strip()
        if _NUMBA_SOURCE.match(stripped):
            in_source = True
        elif in_source:
            in_source = bool(stripped)
        elif not _NUMBA_NOISE.match(stripped):
            lines.append(line.rstrip())
    core = "\n".join(lines).strip()
    core = re.sub(r"(Type of variable '.*' cannot be determined), operation: .*", r"\1", core)
    no_impl = _NUMBA_NO_IMPL.search(core)
    if no_impl is None:
        return re.sub(r"\n\s*\n+", "\n", core) or "type error"
    reasons = _NUMBA_REASON.findall(core)
    reason = f": {reasons[-1].strip()}" if reasons else ""
    return f"cannot call {no_impl.group(1).strip()}{reason}"
