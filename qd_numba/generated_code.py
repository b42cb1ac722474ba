"""Python source that qd_numba generates at run time (call paths, launch runners, stubs).

:func:`exec_generated` compiles such source under a ``<qd_numba what #digest>`` file name (the
digest of ``what`` and the source) and registers it in :mod:`linecache`, so tracebacks through
generated code show its lines, and ``QD_DUMP_GENERATED=1`` prints each source when it is
generated.

Compiling the source (``compile()``) is most of the generated code's cost in a process whose
kernels come from the offline cache (~0.5 ms of a 1-loop CUDA kernel's first call on the H100
host). The code objects are therefore kept, by that digest, in this process and, with the
offline cache on, on disk next to the kernels (``marshal``, in ``.qdg`` files under the cache's
version tag, which holds the Python version; the interpreter's bytecode magic number is in the
key): a later process that generates the same source loads its code instead of compiling it. The
offline cache hands its store down (:func:`keep_code_in`): this module sits below it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import linecache
import marshal
import sys
from collections.abc import Callable

from . import config

_codes: dict = {}       # digest -> code object compiled or loaded in this process
_store: tuple | None = None     # (load(key) -> bytes | None, store(key, bytes)), or None


def keep_code_in(load: Callable[[str], bytes | None] | None, store: Callable[[str, bytes], None] | None) -> None:
    """Where code objects are kept between processes (offline_cache.py hands its store down):
    ``load(key)`` gives what ``store(key, data)`` wrote, or None; either is asked only while the
    offline cache is on for the configuration in force."""
    global _store
    _store = (load, store) if load is not None and store is not None else None


def exec_generated(source: str, what: str, namespace: dict) -> dict:
    """Execute ``source`` in ``namespace`` (returned) under the file name ``<qd_numba what #d>``."""
    digest = hashlib.sha256(f"{what}\0{source}".encode()).hexdigest()
    filename = f"<qd_numba {what} #{digest[:12]}>"
    lines = source.splitlines(keepends=True)
    # an mtime of None: linecache.checkcache never drops the entry (there is no file to compare)
    linecache.cache[filename] = (len(source), None, lines, filename)
    if config.current.dump_generated:
        print(f"=== qd_numba generated source {filename} ===\n{source}", file=sys.stderr)
    code = _codes.get(digest)
    if code is None:
        code = _codes[digest] = _cached_code(digest, source, filename)
    exec(code, namespace)
    return namespace


def _cached_code(digest: str, source: str, filename: str):
    """The code of ``source``: from the offline cache, or compiled (and written there)."""
    cfg = config.current
    if _store is None or not cfg.offline_cache or cfg.dump_generated:
        return compile(source, filename, "exec")
    load, store = _store
    key = f"{importlib.util.MAGIC_NUMBER.hex()}-{digest}"
    stored = load(key)
    if isinstance(stored, bytes):
        try:
            code = marshal.loads(stored)
        except (EOFError, ValueError, TypeError):
            code = None
        if code is not None and getattr(code, "co_filename", None) == filename:
            return code
    code = compile(source, filename, "exec")
    store(key, marshal.dumps(code))
    return code
