"""The versions of the CUDA toolchain that makes our cubins (NVVM and nvJitLink), for the
offline cache's keys, without loading the libraries in a process whose kernels all come from
the cache.

Asking the libraries their versions means loading them (5-20 ms of ``dlopen``). A process that
did so records, in the offline cache, the libraries it loaded (path, size, modification time)
with their versions, under a key made of what decides which libraries a process loads (the
Python prefix, the CUDA and library-path variables, the version of cuda-bindings). A later
process with the same environment whose recorded libraries are unchanged on disk takes the
versions from the record. Where the record is wrong (a library installed since, found first
by the search), the first compile of the process, which loads the libraries anyway, notices,
rewrites the record and keys its own entries by the real versions; an entry looked up under the
recorded versions holds code of the same kernel made by the previous toolchain, which is still
a correct program for the device."""

from __future__ import annotations

import hashlib
import os
import sys
import threading

from ... import config, offline_cache

_LIBRARIES = ("nvvm", "nvJitLink")
_ENVIRONMENT = ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CONDA_PREFIX")

_known: str | None = None   # this process's versions string, once recorded or asked
_asked = False              # whether this process asked the libraries
_lock = threading.RLock()   # qd.init's set-up thread reads the record (runtime.py) while a kernel may compile


def _record_key() -> str:
    bindings = sys.modules.get("cuda.bindings")
    parts = (sys.prefix, *(os.environ.get(v, "") for v in _ENVIRONMENT), getattr(bindings, "__version__", ""))
    return "cuda-toolchain-" + hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def _identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_size, st.st_mtime_ns)


def _ask() -> tuple[str, tuple]:
    """(versions string, identity of each library) from the libraries themselves (loads them)."""
    from cuda.bindings import nvjitlink, nvvm
    from cuda.pathfinder import load_nvidia_dynamic_lib

    versions = f"nvvm{nvvm.version()}{nvvm.ir_version()}-nvjitlink{nvjitlink.version()}"
    return versions, tuple(_identity(load_nvidia_dynamic_lib(name).abs_path) for name in _LIBRARIES)


def versions() -> str:
    """The toolchain part of a cubin's cache key: recorded (no library loaded) or asked."""
    global _known
    if _known is not None:
        return _known
    with _lock:
        if _known is None:
            _known = _recorded() or confirm()
        return _known


def _recorded() -> str | None:
    """The versions of this environment's record if its libraries are unchanged on disk."""
    recorded = offline_cache.load_blob(_record_key()) if config.current.offline_cache else None
    if (isinstance(recorded, tuple) and len(recorded) == 2 and recorded[1]
            and all(lib is not None and _identity(lib[0]) == lib for lib in recorded[1])):
        return recorded[0]
    return None


def confirm() -> str:
    """The versions asked from the libraries, once per process (a compile calls this: it loads
    them anyway); a record that disagrees is rewritten, and this process's keys follow the real
    versions."""
    global _known, _asked
    with _lock:
        if _asked:
            return _known
        real, libraries = _ask()
        _asked = True
        if real != _known and config.current.offline_cache and all(lib is not None for lib in libraries):
            offline_cache.store_blob(_record_key(), (real, libraries))
        _known = real
        return real


def read_record() -> None:
    """Take the versions from the record now, unless known (qd.init's set-up thread, runtime.py:
    a process's first cache lookup then finds them, ~0.25 ms less on the H200 host). A missing
    or stale record is left to that lookup, which asks the libraries."""
    global _known
    with _lock:
        if _known is None:
            _known = _recorded()
