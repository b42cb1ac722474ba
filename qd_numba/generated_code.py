"""Python source that qd_numba generates at run time (call paths, launch runners, stubs).

:func:`exec_generated` compiles such source under a unique ``<qd_numba ...>`` file name and
registers it in :mod:`linecache`, so tracebacks through generated code show its lines, and
``QD_DUMP_GENERATED=1`` prints each source once, when it is generated.
"""

from __future__ import annotations

import itertools
import linecache
import sys

from . import config

_serial = itertools.count()


def exec_generated(source: str, what: str, namespace: dict) -> dict:
    """Execute ``source`` in ``namespace`` (returned) under the file name ``<qd_numba what #n>``."""
    filename = f"<qd_numba {what} #{next(_serial)}>"
    lines = source.splitlines(keepends=True)
    # an mtime of None: linecache.checkcache never drops the entry (there is no file to compare)
    linecache.cache[filename] = (len(source), None, lines, filename)
    if config.current.dump_generated:
        print(f"=== qd_numba generated source {filename} ===\n{source}", file=sys.stderr)
    exec(compile(source, filename, "exec"), namespace)
    return namespace
