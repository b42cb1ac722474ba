"""The offline cache: compiled kernels on disk, reused by later processes (Quadrants' name).

Keys. An entry is named by its *full key*, computed before anything compiles:

* the *fast key* — the kernel's bytecode (:func:`~qd_numba.frontend.keys.code_key`, line
  numbers left out), its qualified name, argument types, return type, the code-changing
  configuration (``keys.CODE_CONFIG``), the target (on CUDA: compute capability, NVVM,
  nvJitLink and numba-cuda versions) and the versions of qd_numba, Numba, llvmlite and Python;
* the *globals snapshot* (:func:`snapshot`) — every value the compiler may read from Python:
  starting at the names the kernel's code uses (its globals, closure cells and template
  arguments), following attributes by the names and identifier string constants the code uses
  (``getattr(obj, "name")``) and the identifier strings reached (``getattr(obj, NAME)``), every
  item of a list, tuple or dict (a long list of scalars by a hash of its content), into every
  user function reached (``qd.func``, ``@numba.njit`` callees, and the methods of a user class
  that Python calls unnamed: operators, ``__call__``, ``__len__``, construction; their bytecode
  and their own globals). Scalars are described by value, fields and ndarrays by layout (and
  which paths reach the same field), functions by code; library objects (qd_numba, Numba, numpy)
  by name, since the versions are in the fast key. A value the snapshot cannot describe (an
  object without attributes to follow, a dict key that is not a scalar or tuple of them) makes
  the kernel uncacheable. What is not followed: state a compile-time call reads without the
  kernel naming it (a file, the environment, a random generator); such a kernel must not use
  the cache (``offline_cache=False``).

Neither runs the frontend, so a hit in a fresh process costs a walk over a few dicts, one file
read and the load of the artefact. The entry stores its full key and the versions; both are
checked on load, so a hash collision or a stale file is a miss. The hidden field arguments of a
hit are the objects the snapshot finds at the paths stored with the entry.

Artefacts: on the CPU the kernel's LLVM library as object code plus the Numba function
descriptor and environments (rebuilt as Numba's own cache does, ``CompileResult._rebuild``), the
Task list and the hidden-field paths; on CUDA the ``PlanBinary`` of targets/cuda/plan.py (cubins
and what the launch plan is built from) and the hidden-field paths, its cubins loaded on a hit.
Loaded artefacts are kept per process: an entry loaded twice (after ``qd.init``) is linked once.

Files. ``<offline_cache_file_path>/<version tag>/<key[:2]>/<key>.qdc``; written to a temporary
file and renamed (``os.replace``) under a ``filelock`` lock of the cache directory, so readers
never see a partial file and concurrent writers of one key leave one complete entry. A file
that cannot be read, unpickled or loaded is a miss: a :class:`~qd_numba.errors.QuadrantsWarning`,
the file is removed, the kernel compiles. A cache directory that cannot be written (read-only,
disk full) gives one warning per process, never an error. After each write the directory is
cleaned as ``offline_cache_cleaning_policy`` says (``lru``, ``fifo``, ``version``, ``never``)
when it is over ``offline_cache_max_size_of_files``.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import os
import pickle
import shutil
import sys
import tempfile
import threading
import types as pytypes
import warnings

import numpy as np

from . import config, generated_code
from .errors import QuadrantsWarning
from .field import ArrayData
from .frontend.keys import CODE_CONFIG, code_key, value_key

FORMAT = 6                  # bump when the entry layout or the code generated changes (2: CPU entries take a
                            # field table; 3: CUDA grid-stride loops without a trip count; 4: vectorized
                            # CPU field loops; 5: entries hold their full key's text; 6: weak float literals)
SUFFIX = ".qdc"
CODE_SUFFIX = ".qdg"          # generated Python's code objects (generated_code.py)
_LIB_MODULES = ("qd_numba", "numba", "numpy", "llvmlite", "math", "cmath", "builtins", "operator", "functools")
_MAX_NODES = 20_000         # a bigger snapshot is uncacheable (a huge object graph reached by name)
_MAX_ITEMS = 256            # a longer sequence of scalars is described by its content, as one node


@dataclasses.dataclass
class Stats:
    """What the cache did in this process (tests and benchmarks read it)."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    discarded: int = 0      # unreadable or mismatched entries removed
    uncacheable: int = 0    # kernels whose snapshot could not be taken


stats = Stats()
_loaded: dict = {}          # full key -> artefact loaded in this process (linked once)
_lock = threading.Lock()
_warned: set = set()        # (directory, kind) warned about once


# -- versions and paths ------------------------------------------------------------------------------

def versions() -> tuple:
    """The compiler stack every entry depends on (numba-cuda's version is in the target of the
    CUDA and AMDGPU keys: a CPU entry must not depend on whether numba-cuda was imported)."""
    import llvmlite
    import numba

    from . import __version__

    return (FORMAT, __version__, numba.__version__, llvmlite.__version__, sys.version_info[:2])


def version_tag() -> str:
    return hashlib.sha256(repr(versions()[:4]).encode()).hexdigest()[:16]


def default_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "qd_numba", "qdcache")


def cache_root(cfg=None) -> str:
    cfg = cfg or config.current
    return os.path.abspath(os.path.expanduser(cfg.offline_cache_file_path or default_path()))


def enabled(cfg) -> bool:
    """Whether kernels compiled under ``cfg`` use the cache (the profiler's and IR dumps' compiles never do)."""
    return cfg.offline_cache and not cfg.kernel_profiler and not cfg.print_ir and not cfg.dump_generated


def clear_offline_cache(path: str | None = None) -> None:
    """Remove every entry of the offline cache (``path``, default: the configured directory)."""
    root = os.path.abspath(os.path.expanduser(path)) if path else cache_root()
    if os.path.isdir(root):
        with _dir_lock(root):
            for name in os.listdir(root):
                full = os.path.join(root, name)
                if os.path.isdir(full):
                    shutil.rmtree(full, ignore_errors=True)
                elif name.endswith(SUFFIX):
                    os.unlink(full)
    with _lock:
        _loaded.clear()


# -- keys -----------------------------------------------------------------------------------------------

def _is_lib(obj) -> bool:
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    return isinstance(module, str) and module.split(".")[0] in _LIB_MODULES


def _user_function(value):
    """The Python function behind a user function, qd.func or njit dispatcher, or None."""
    fn = getattr(value, "py_func", None) or value
    if not isinstance(fn, pytypes.FunctionType):
        inner = getattr(value, "fn", None)
        fn = inner if isinstance(inner, pytypes.FunctionType) else None
    return None if fn is None or _is_lib(fn) else fn


def _code_names(code) -> set:
    """The attribute names ``code`` may read: its names, and its string constants that are
    identifiers (``getattr(obj, "scale")``, ``hasattr``), nested code objects included."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            names |= _code_names(c)
        elif isinstance(c, str) and c.isidentifier():
            names.add(c)
    return names


_SCALARS = (type(None), bool, int, float, complex, str, bytes, np.generic)
# methods of a user class that Python calls without naming them (operators, len, in, iteration,
# calls, truth, conversions, attribute hooks): a compile-time expression may run any of them
_IMPLICIT_METHODS = frozenset({
    "__call__", "__getitem__", "__len__", "__iter__", "__next__", "__contains__", "__bool__", "__int__",
    "__float__", "__index__", "__complex__", "__getattr__", "__getattribute__", "__eq__", "__ne__", "__lt__",
    "__le__", "__gt__", "__ge__", "__hash__", "__neg__", "__pos__", "__abs__", "__invert__", "__get__",
    "__mro_entries__", "__reversed__", "__missing__",
    *(f"__{r}{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                                "or", "xor", "lshift", "rshift") for r in ("", "r")),
})
_CONSTRUCTION = frozenset({"__new__", "__init__", "__post_init__", "__init_subclass__"})


class _Uncacheable(Exception):
    pass


class _Walk:
    """One pass of :func:`snapshot` with a fixed set of attribute names."""

    def __init__(self, names: set):
        self.names = sorted(names)
        self.items = []         # (path, description)
        self.arrays = {}        # path -> ArrayData
        self.seen = {}          # id(object) -> path first reached (non-scalars)
        self.functions = []     # user functions reached, in order
        self.keep = []          # objects whose ids are in ``seen``
        self.strings = set()    # identifier strings reached (``getattr(obj, NAME)`` with a global NAME)

    def function_roots(self, fn) -> None:
        where = f"{fn.__module__}.{fn.__qualname__}"
        names = _code_names(fn.__code__)
        for name in sorted(names):
            if name in fn.__globals__:
                self.visit((where, "g", name), fn.__globals__[name], 0)
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:      # an empty cell (a name assigned later)
                continue
            self.visit((where, "f", name), value, 0)

    def visit(self, path, value, depth) -> None:
        if len(self.items) > _MAX_NODES or depth > 8:
            raise _Uncacheable(f"too many objects reached from {path[0]}")
        if isinstance(value, _SCALARS):
            self.items.append((path, value_key(value)))
            if isinstance(value, str) and value.isidentifier():
                self.strings.add(value)
            return
        first = self.seen.get(id(value))
        if first is not None:
            self.items.append((path, ("same", first)))
            return
        self.seen[id(value)] = path
        self.keep.append(value)
        if isinstance(value, ArrayData):
            # with whether it has a gradient and a dual: a derivative kernel's code depends on it
            self.items.append((path, (value_key(value), getattr(value, "grad", None) is not None,
                                      getattr(value, "dual", None) is not None)))
            self.arrays[path] = value
            return
        if isinstance(value, np.ndarray):
            self.items.append((path, ("array", value.dtype.str, value.shape,
                                      hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest())))
            return
        if isinstance(value, (tuple, list)):
            if len(value) > _MAX_ITEMS and all(isinstance(item, _SCALARS) for item in value):
                # a long sequence of scalars by its content, as one node (and none of its strings
                # are attribute names the code may read)
                digest = hashlib.sha256(repr(value_key(value)).encode()).hexdigest()
                self.items.append((path, (type(value).__name__, len(value), digest)))
                return
            self.items.append((path, (type(value).__name__, len(value))))
            for k, item in enumerate(value):
                self.visit(path + (k,), item, depth + 1)
            return
        if isinstance(value, dict):
            keys = [(value_key(k), k) for k in value]
            if any(described is None for described, _ in keys):
                raise _Uncacheable(f"{'.'.join(map(str, path))}: a dict with a key that cannot be described")
            self.items.append((path, ("dict", len(value))))
            for described, k in sorted(keys, key=lambda pair: repr(pair[0])):
                self.visit(path + (("key", described),), value[k], depth + 1)
            return
        fn = _user_function(value)
        if fn is not None:
            self.items.append((path, ("function", type(value).__name__, fn.__module__, fn.__qualname__,
                                      code_key(fn.__code__))))
            self.functions.append(fn)
            return
        if _is_lib(value) or (not isinstance(value, type) and _is_lib(type(value))):
            self.items.append((path, self._library_object(value)))
            return
        if isinstance(value, pytypes.ModuleType):
            self.items.append((path, ("module", value.__name__)))
        elif isinstance(value, type):
            self.items.append((path, ("class", value.__module__, value.__qualname__)))
        elif type(value).__repr__ is object.__repr__ or hasattr(value, "__dict__"):
            self.items.append((path, ("instance", type(value).__module__, type(value).__qualname__)))
        else:
            raise _Uncacheable(f"{'.'.join(map(str, path))}: a {type(value).__name__} cannot be described")
        if isinstance(value, type):
            self._implicit_methods(path, value, _CONSTRUCTION | _IMPLICIT_METHODS, depth)
        else:
            self._implicit_methods(path, type(value), _IMPLICIT_METHODS, depth)
        self._attributes(path, value, depth)

    def _implicit_methods(self, path, cls, which: frozenset, depth) -> None:
        """The methods of a user class that Python calls without the code naming them (an
        operator, ``len``, ``in``, a call on an instance, construction for a class): by their
        code, like any function."""
        for klass in cls.__mro__:
            if _is_lib(klass) or klass.__module__.split(".")[0] in sys.stdlib_module_names:
                continue        # object, Enum, ABC...: the Python version is in the key
            for name in sorted(which.intersection(vars(klass))):
                method = vars(klass)[name]
                method = getattr(method, "__func__", method)     # staticmethod / classmethod
                self.visit(path + (("method", klass.__qualname__, name),), method, depth + 1)

    def _attributes(self, path, value, depth) -> None:
        for name in self.names:
            try:
                attr = getattr(value, name)
            except Exception:    # an attribute the object has not, or a property that raises
                continue
            if isinstance(attr, pytypes.MethodType):
                attr = attr.__func__
            self.visit(path + (name,), attr, depth + 1)

    @staticmethod
    def _library_object(value):
        """A qd_numba/Numba/numpy object: modules, classes and functions by name (the versions are
        in the key), values by content."""
        if isinstance(value, (pytypes.ModuleType, type, pytypes.FunctionType, pytypes.BuiltinFunctionType)):
            return ("lib", getattr(value, "__module__", None), getattr(value, "__qualname__", None)
                    or getattr(value, "__name__", None))
        key = value_key(value)
        if key is not None:
            return key
        text = repr(value)
        if " at 0x" in text:
            try:
                return ("pickled", hashlib.sha256(pickle.dumps(value)).hexdigest())
            except Exception:
                return ("lib-object", type(value).__module__, type(value).__qualname__)
        return ("repr", type(value).__module__, type(value).__qualname__, text)


def snapshot(kernel, templates: dict):
    """(description, {path: field/ndarray}) of everything the compiler may read from Python for
    this kernel (module docstring), or None if some value cannot be described."""
    names = _code_names(kernel.fn.__code__)
    for _ in range(8):      # attribute names grow with the functions reached: iterate to a fixed point
        walk = _Walk(names)
        try:
            for name in sorted(templates):
                walk.visit(("template", name), templates[name], 0)
            walk.function_roots(kernel.fn)
            done = set()
            for fn in walk.functions:       # grows while iterating
                if fn not in done:
                    done.add(fn)
                    walk.function_roots(fn)
        except _Uncacheable:
            return None
        grown = names.union(walk.strings, *(_code_names(fn.__code__) for fn in walk.functions))
        if grown == names:
            return tuple(walk.items), walk.arrays
        names = grown
    return None


def fast_key(kernel, param_types: dict, cfg, target: str) -> tuple:
    """What identifies a kernel instance apart from the values its code reads from Python."""
    code_config = tuple((f.name, repr(getattr(cfg, f.name))) for f in dataclasses.fields(cfg) if f.name in CODE_CONFIG)
    return (versions(), target, kernel.qualname, code_key(kernel.fn.__code__),
            tuple((n, str(t)) for n, t in sorted(param_types.items())), str(kernel.return_type),
            kernel.graph, kernel.fuse, code_config)


@dataclasses.dataclass(frozen=True)
class DerivedField:
    """A hidden field that no name reaches, stored by how a hit finds or makes it: the ``grad``
    or ``dual`` of the field at snapshot path ``base``, the process's ``qd.random`` state, or a
    ``scratch`` field of the compiler's own (a kernel's reduction cells: ``dtype``, ``shape``),
    made anew (the kernel writes it before it reads it)."""

    kind: str               # "grad" | "dual" | "random state" | "scratch"
    base: tuple = ()
    dtype: object = None
    shape: tuple = ()
    name: str = ""

    @staticmethod
    def of(field, by_id: dict, arrays: dict):
        """How a hit gets ``field``, or None if it cannot."""
        if getattr(field, "is_scratch", False):
            return DerivedField("scratch", dtype=field.dtype, shape=field.shape, name=field.name)
        random_state = sys.modules.get(f"{__package__}.random_state")
        if random_state is not None and field is random_state.current():
            return DerivedField("random state")
        for path in by_id.values():     # the first path of each object reached
            obj = arrays[path]
            for kind in ("grad", "dual"):
                if getattr(obj, kind, None) is field:
                    return DerivedField(kind, base=path)
        return None

    def find(self, arrays: dict):
        """The field in this process (None if it has none: the entry does not fit)."""
        if self.kind == "scratch":
            from .field import Field

            return Field.scratch(self.dtype, self.shape, self.name)
        if self.kind == "random state":
            from . import random_state

            return random_state.state_field()
        return getattr(arrays.get(self.base), self.kind, None)


@dataclasses.dataclass
class Lookup:
    """One kernel instance's place in the cache: its key and the objects its snapshot reached."""

    key: str
    arrays: dict            # path -> field/ndarray
    root: str
    suffix: str = SUFFIX
    full: str = ""          # the full key's text (``key`` is its hash): stored in the entry, compared on load

    @property
    def path(self) -> str:
        return os.path.join(self.root, version_tag(), self.key[:2], self.key + self.suffix)

    def hidden_paths(self, hidden) -> list | None:
        """Where a hit finds each hidden field (in order): its snapshot path, or a
        :class:`DerivedField`; None if one cannot be found (the instance is not stored)."""
        by_id = {}
        for path, obj in self.arrays.items():
            by_id.setdefault(id(obj), path)
        paths = [by_id.get(id(f)) or DerivedField.of(f, by_id, self.arrays) for f in hidden]
        return None if any(p is None for p in paths) else paths

    def hidden_fields(self, paths: list) -> list | None:
        """The hidden fields of a hit in this process, from :meth:`hidden_paths`' list, or None
        when one is missing (a field without the ``.grad`` it had: the kernel compiles)."""
        fields = [p.find(self.arrays) if isinstance(p, DerivedField) else self.arrays.get(p) for p in paths]
        return None if any(f is None for f in fields) else fields


def lookup(kernel, param_types: dict, templates: dict, cfg, target: str) -> Lookup | None:
    """The cache place of this instance, or None when it is not cached (disabled, or its
    snapshot cannot be taken)."""
    if not enabled(cfg):
        return None
    snap = snapshot(kernel, templates)
    if snap is None:
        stats.uncacheable += 1
        return None
    description, arrays = snap
    full = repr((fast_key(kernel, param_types, cfg, target), description))
    return Lookup(hashlib.sha256(full.encode()).hexdigest(), arrays, cache_root(cfg), full=full)


# -- reading and writing ----------------------------------------------------------------------------------

def _warn(message: str) -> None:
    warnings.warn(QuadrantsWarning(f"offline cache: {message}"), stacklevel=4)


def _warn_once(root: str, kind: str, message: str) -> None:
    if (root, kind) not in _warned:
        _warned.add((root, kind))
        _warn(message)


def load(place: Lookup, rebuild):
    """The artefact of ``place``: from this process if loaded before, else from its file through
    ``rebuild(payload)``. None on a miss; a bad entry is removed with a warning."""
    with _lock:
        artefact = _loaded.get(place.key)
    if artefact is not None:
        stats.hits += 1
        return artefact
    try:
        with open(place.path, "rb") as f:
            data = f.read()
    except OSError:           # no entry (or removed since): a miss
        stats.misses += 1
        return None
    try:
        stored_versions, stored_key, payload = pickle.loads(data)
        if stored_versions != versions() or stored_key != place.full:
            raise ValueError(f"written by another version ({stored_versions}) or for another key")
        artefact = rebuild(payload)
    except Exception as e:  # a truncated, corrupt or foreign file: never trusted, never fatal
        _warn(f"discarding the unusable entry {place.path} ({type(e).__name__}: {str(e)[:200]}); compiling again")
        stats.discarded += 1
        stats.misses += 1
        _remove(place.path)
        return None
    if config.current.offline_cache_cleaning_policy == "lru":
        _touch(place.path)
    with _lock:
        artefact = _loaded.setdefault(place.key, artefact)
    stats.hits += 1
    return artefact


def store(place: Lookup, payload, artefact) -> None:
    """Write ``payload`` as the entry of ``place`` (atomically), and remember ``artefact`` as
    loaded. A directory that cannot be written gives one warning per process."""
    with _lock:
        _loaded[place.key] = artefact
    try:
        data = pickle.dumps((versions(), place.full, payload), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:   # a value the artefact holds has no pickled form (a module object in a loop bound)
        stats.uncacheable += 1
        return
    if _write(place, data):
        stats.writes += 1


def _write(place: Lookup, data: bytes) -> bool:
    """Write ``data`` as the file of ``place``: a temporary file renamed under the directory's
    lock, then the cleaning policy. False (and one warning per process) if it cannot be written."""
    return _write_files(place.root, [(place.path, data)])


def _write_files(root: str, files: list, clean_after: bool = True) -> bool:
    """Write each ``(path, data)`` under ``root`` as :func:`_write` does, under one lock (the
    cleaning policy after, unless ``clean_after`` is False)."""
    tmp = None
    try:
        os.makedirs(root, exist_ok=True)
        with _dir_lock(root):
            for path, data in files:
                directory = os.path.dirname(path)
                os.makedirs(directory, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=SUFFIX)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
                tmp = None
            if clean_after:
                clean(root)
        return True
    except OSError as e:
        _warn_once(root, "write", f"cannot write to {root} ({e}); kernels compile in every process")
        return False
    finally:
        if tmp is not None:
            _remove(tmp)


def load_blob(key: str, suffix: str = SUFFIX):
    """A process-independent artefact that is not a kernel (the CUDA launchers' object code),
    stored under ``key`` by :func:`store_blob`, or None. Kernel statistics are not counted. A
    file that is damaged (its checksum is verified: machine code is never loaded from a damaged
    file), foreign or of another version is removed with a warning."""
    place = Lookup(key, {}, cache_root(), suffix)
    try:
        with open(place.path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        stored_versions, stored_key, (digest, blob) = pickle.loads(data)
        if stored_versions != versions() or stored_key != key or hashlib.sha256(blob).hexdigest() != digest:
            raise ValueError("another version or key, or a checksum mismatch")
        return pickle.loads(blob)
    except Exception as e:
        _warn(f"discarding the unusable entry {place.path} ({type(e).__name__}: {str(e)[:200]})")
        _remove(place.path)
        return None


def store_blob(key: str, value, suffix: str = SUFFIX) -> None:
    """Write ``value`` (picklable, holding nothing specific to this process) under ``key``."""
    place = Lookup(key, {}, cache_root(), suffix)
    _write(place, _blob_file(key, value))


def _blob_file(key: str, value) -> bytes:
    """The bytes of a blob's file: the versions, the key, the checksum and the pickled value."""
    blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.dumps((versions(), key, (hashlib.sha256(blob).hexdigest(), blob)), protocol=pickle.HIGHEST_PROTOCOL)


def _load_code(key: str) -> bytes | None:
    return load_blob(key, CODE_SUFFIX)


_pending_code: dict = {}      # path -> (cache root, file bytes): code objects not written yet
_pending_lock = threading.Lock()
_FLUSH_AT = 64
_flush_registered = False


def _store_code(key: str, data: bytes) -> None:
    """Queue a code object's file; :func:`flush_generated_code` writes the queue at exit, or
    once 64 are queued. A write takes the cache directory's lock: one per source would cost a
    cold first call up to five lock rounds (~140 ms on the H100 host's disk)."""
    global _flush_registered
    place = Lookup(key, {}, cache_root(), CODE_SUFFIX)
    with _pending_lock:
        _pending_code[place.path] = (place.root, _blob_file(key, data))
        full = len(_pending_code) >= _FLUSH_AT
        if not _flush_registered:
            atexit.register(flush_generated_code)
            _flush_registered = True
    if full:
        flush_generated_code()


def flush_generated_code() -> None:
    """Write the queued code objects of generated Python (:func:`_store_code`) now."""
    with _pending_lock:
        pending = list(_pending_code.items())
        _pending_code.clear()
    by_root: dict = {}
    for path, (root, data) in pending:
        by_root.setdefault(root, []).append((path, data))
    for root, files in by_root.items():
        _write_files(root, files, clean_after=False)


generated_code.keep_code_in(_load_code, _store_code)


def _dir_lock(root: str):
    from filelock import FileLock

    os.makedirs(root, exist_ok=True)
    return FileLock(os.path.join(root, ".lock"), timeout=60)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _entries(root: str) -> list:
    """(path, size, mtime) of every entry under ``root``."""
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith((SUFFIX, CODE_SUFFIX)) and not name.startswith(".tmp-"):
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                out.append((full, st.st_size, st.st_mtime))
    return out


def clean(root: str, cfg=None) -> None:
    """Apply the cleaning policy to ``root`` (called with its lock held, after a write)."""
    cfg = cfg or config.current
    policy = cfg.offline_cache_cleaning_policy
    if policy == "never":
        return
    entries = _entries(root)
    limit = cfg.offline_cache_max_size_of_files
    if sum(size for _, size, _ in entries) <= limit:
        return
    if policy == "version":     # drop the entries of other versions
        current = version_tag()
        for name in os.listdir(root):
            if name != current and os.path.isdir(os.path.join(root, name)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        return
    # lru (hits refresh the mtime) / fifo (mtime is the write time): remove the oldest first
    target = limit * (1.0 - cfg.offline_cache_cleaning_factor)
    total = sum(size for _, size, _ in entries)
    for path, size, _ in sorted(entries, key=lambda e: e[2]):
        if total <= target:
            break
        _remove(path)
        total -= size


# -- the CPU artefact -----------------------------------------------------------------------------------

def cpu_payload(cres, tasks, hidden_paths) -> tuple:
    """What a CPU entry stores: the compiled driver as Numba caches it (object code, function
    descriptor, environments), the Tasks (without their Numba types, which are compile-time
    data and do not pickle) and the hidden-field paths."""
    return cres._reduce(), [dataclasses.replace(t, types=None) for t in tasks], hidden_paths


def cpu_rebuild(payload) -> tuple:
    """(CompileResult, tasks, hidden paths) from :func:`cpu_payload`'s tuple."""
    from numba.core.compiler import CompileResult
    from numba.core.registry import cpu_target

    from .targets.cpu import ensure_runtime_for

    reduced, tasks, hidden_paths = payload
    libdata = reduced[0]        # (name, "object", (object code, bitcode)): Numba's serialized library
    ensure_runtime_for(libdata[2][0] if libdata[1] == "object" else None)
    return CompileResult._rebuild(cpu_target.target_context, *reduced), tasks, hidden_paths
