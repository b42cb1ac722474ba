"""``@qd.kernel(graph=True)`` on every target, and the ``qd.graph`` namespace.

A graph kernel's tasks are captured once into a CUDA graph and replayed on later calls (the CUDA
target: targets/cuda/graphs.py); on other targets ``graph=True`` changes nothing. As in
Quadrants, a graph kernel returns nothing and runs on the default stream: this module raises
our errors, naming the kernel, for what breaks those rules (docs/graphs.md). Its derivative
kernels (``kernel.grad``, forward mode) run with plain launches, as in Quadrants. Fusion keeps
one task per loop in graph kernels (``Config.for_kernel``).

``qd.graph.do_while``, ``qd.graph.parallel_context`` and ``qd.graph.parallel`` structure a graph
kernel; :func:`prepare` rewrites a kernel that uses them before the frontend sees it (the
comment before :func:`do_while`).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import inspect
import textwrap
import types

from .errors import QuadrantsRuntimeError, QuadrantsSyntaxError, QuadrantsTypeError, located
from .field import Ndarray


def check_returns(name: str, returns) -> None:
    """A graph kernel declared with a return value (``-> T``) is refused when decorated."""
    if returns is not None:
        raise QuadrantsSyntaxError(f"kernel '{name}': a graph=True kernel cannot return a value (a graph replay "
                                   "reads nothing back); write the result to a field or ndarray instead")


def stream_error(name: str) -> QuadrantsRuntimeError:
    """``qd_stream=`` on a graph kernel (refused, as in Quadrants: the graph replays on the
    default stream)."""
    return QuadrantsRuntimeError(f"kernel '{name}': qd_stream= is not compatible with graph=True kernels (the graph "
                                 "replays on the default stream); call it without qd_stream=, or order it with "
                                 "events")


# -- qd.graph.do_while / parallel_context / parallel ---------------------------------------------------
#
# These constructs structure a graph kernel's tasks; they are never called inside a kernel. When a
# kernel's code names one of them (``_uses_constructs``, on its names, so other kernels pay nothing),
# its source is rewritten before the frontend sees it (``prepare``):
#
# * ``with qd.graph.parallel_context():`` / ``with qd.graph.parallel():`` blocks are unwrapped: the
#   sections run one after the other, in source order (correct under their contract: no section
#   reads what another writes), as Quadrants runs them off CUDA; the line ranges of the sections
#   of a region whose sections start and end with loops are kept (``Kernel.graph_sections``), and
#   a CUDA graph makes their tasks concurrent branches (:func:`section_labels`, :func:`dependencies`);
# * ``while qd.graph.do_while(flag):`` splits the kernel into kernels of the same parameters: the
#   statements before the loop, its body (split again when it holds another loop), the statements
#   after it. :class:`DoWhileKernel` runs them: the body at least once, again while the 0-d ndarray
#   argument ``flag`` holds a non-zero value, read on the host after each pass (Quadrants' host
#   fallback; each part is a graph kernel, so on CUDA each pass is one graph replay).

_CONSTRUCTS = ("do_while", "parallel_context", "parallel")
__all__ = ["do_while", "parallel", "parallel_context"]     # the qd.graph namespace, as Quadrants'


def do_while(flag) -> bool:
    """``while qd.graph.do_while(flag):`` in a ``graph=True`` kernel: repeat the loop's body, at
    least once, while the 0-d ``qd.i32`` ndarray argument ``flag`` is non-zero (docs/graphs.md).
    Outside kernels: ``bool(flag)``."""
    return bool(flag)


@contextlib.contextmanager
def parallel_context():
    """``with qd.graph.parallel_context():`` in a ``graph=True`` kernel: a region of
    ``with qd.graph.parallel():`` sections that write disjoint data (docs/graphs.md). Outside
    kernels: does nothing."""
    yield


@contextlib.contextmanager
def parallel():
    """``with qd.graph.parallel():``: one section of a ``qd.graph.parallel_context()`` region."""
    yield


def _uses_constructs(code) -> bool:
    return any(name in code.co_names for name in _CONSTRUCTS)


def _construct(node, name: str) -> bool:
    """Whether ``node`` is a call of ``<...>.graph.<name>(...)`` (or ``graph.<name>(...)``)."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.func.attr != name:
        return False
    owner = node.func.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "graph") or \
        (isinstance(owner, ast.Name) and owner.id == "graph")


def _with_of(stmt, name: str) -> bool:
    return isinstance(stmt, ast.With) and len(stmt.items) == 1 and _construct(stmt.items[0].context_expr, name)


def _loop_of(stmt) -> bool:
    return isinstance(stmt, ast.While) and _construct(stmt.test, "do_while")


class _Source:
    """A kernel function's source as an AST, and our errors located in it."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__
        self.filename = fn.__code__.co_filename
        self.regions: list = []     # parallel regions whose sections may be concurrent graph branches
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
        self.fdef = tree.body[0]

    def error(self, node, message: str) -> QuadrantsSyntaxError:
        loc = types.SimpleNamespace(filename=self.filename, line=getattr(node, "lineno", None))
        return located(QuadrantsSyntaxError, message, self.name, loc)


def _check_nowhere_else(src: _Source, stmts, where: str) -> None:
    """No construct inside other statements (for, if, while bodies, sections)."""
    for stmt in stmts:
        for node in ast.walk(stmt):
            for name in _CONSTRUCTS:
                if _construct(node, name):
                    raise src.error(node, f"qd.graph.{name}() {where}")


def _unwrap(src: _Source, stmts) -> list:
    """The statements of one level (kernel top or a do_while body) with parallel regions
    unwrapped; checks where the constructs are."""
    out = []
    for stmt in stmts:
        if _with_of(stmt, "parallel_context"):
            for section in stmt.body:
                if isinstance(section, ast.Expr) and isinstance(section.value, ast.Constant):
                    continue        # a docstring-like string
                if not _with_of(section, "parallel"):
                    raise src.error(section, "a qd.graph.parallel_context() region may contain only "
                                             "'with qd.graph.parallel():' sections")
                _check_nowhere_else(src, section.body, "cannot be nested inside a qd.graph.parallel() section")
                out += section.body
            sections = [section for section in stmt.body if _with_of(section, "parallel")]
            if all(_bounded_by_loops(section.body) for section in sections):
                src.regions.append(tuple((section.lineno, section.end_lineno) for section in sections))
        elif _with_of(stmt, "parallel"):
            raise src.error(stmt, "qd.graph.parallel() must be directly inside 'with qd.graph.parallel_context():'")
        elif _loop_of(stmt):
            if stmt.orelse:
                raise src.error(stmt, "'else' clause for 'while' not supported in Quadrants kernels")
            flag = stmt.test.args[0] if len(stmt.test.args) == 1 and not stmt.test.keywords else None
            if not isinstance(flag, ast.Name):
                raise src.error(stmt, "qd.graph.do_while() takes one argument, the name of a 0-d qd.i32 ndarray "
                                      "parameter of the kernel")
            stmt.body = _unwrap(src, stmt.body)
            out.append(stmt)
        else:
            _check_nowhere_else(src, [stmt], "must be at the kernel top level or directly inside a "
                                             "qd.graph.do_while() body (not inside a for loop, an if or a while)")
            out.append(stmt)
    return out


def _bounded_by_loops(stmts) -> bool:
    """Whether a section's first and last statements (``qd.loop_config`` calls aside) are
    parallel ``for`` loops: then its serial code is in tasks of its own, none shared with the
    code around it, and the section can be a branch of its own in the graph."""
    body = [s for s in stmts if not (isinstance(s, ast.Expr) and (
        isinstance(s.value, ast.Constant) or (isinstance(s.value, ast.Call) and _named(s.value.func, "loop_config"))))]

    def loop(stmt):
        return isinstance(stmt, ast.For) and not (isinstance(stmt.iter, ast.Call) and _named(stmt.iter.func, "static"))

    return bool(body) and loop(body[0]) and loop(body[-1])


def _named(func, name: str) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == name) or (isinstance(func, ast.Name) and func.id == name)


def _function(src: _Source, body: list, suffix: str):
    """A function of the kernel's parameters running ``body``, compiled where the kernel's own
    code lives (its globals, the values of its closure cells), its line numbers kept."""
    fn, fdef = src.fn, copy.copy(src.fdef)
    fdef.decorator_list, fdef.returns = [], None
    fdef.args = copy.deepcopy(fdef.args)
    for arg in fdef.args.args + fdef.args.posonlyargs + fdef.args.kwonlyargs:
        arg.annotation = None       # evaluated where the kernel was defined: copied below
    fdef.args.defaults, fdef.args.kw_defaults = [], [None] * len(fdef.args.kwonlyargs)
    fdef.body = body or [ast.Pass(lineno=fdef.lineno, col_offset=0)]
    # def __qd_outer(<the kernel's free variables>): <the function>; return it
    module = ast.parse(f"def __qd_outer({', '.join(fn.__code__.co_freevars)}):\n    return {fdef.name}\n")
    module.body[0].body.insert(0, fdef)
    module = ast.fix_missing_locations(module)
    scope: dict = {}
    exec(compile(module, src.filename, "exec"), fn.__globals__, scope)  # noqa: S102 - the user's own kernel
    try:
        values = [cell.cell_contents for cell in fn.__closure__ or ()]
    except ValueError:
        raise src.error(src.fdef, "a kernel using qd.graph constructs cannot read a variable of its enclosing "
                                  "function that is assigned after the kernel is defined") from None
    new = scope["__qd_outer"](*values)
    new.__annotations__ = dict(fn.__annotations__)
    new.__defaults__, new.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    new.__module__, new.__doc__ = fn.__module__, fn.__doc__
    new.__qualname__ = fn.__qualname__ + suffix
    return new


def prepare(fn, graph: bool, make_kernel):
    """The kernel for ``fn``: ``make_kernel(fn)`` when its code names no qd.graph construct,
    else made from its rewritten source (module comment above); a construct in a kernel
    without ``graph=True`` is our error naming the kernel and line, as in Quadrants."""
    if not _uses_constructs(fn.__code__):
        return make_kernel(fn)
    try:
        src = _Source(fn)
    except (OSError, TypeError, SyntaxError):
        return make_kernel(fn)      # no source to read: the frontend reports what it meets
    uses = [(node, name) for node in ast.walk(src.fdef) for name in _CONSTRUCTS if _construct(node, name)]
    if not uses:
        return make_kernel(fn)
    if not graph:
        node, name = uses[0]
        raise src.error(node, f"qd.graph.{name}() requires @qd.kernel(graph=True)")
    params = {p.arg: p for p in src.fdef.args.args}
    body = _unwrap(src, src.fdef.body)

    def make(f):
        kernel = make_kernel(f)
        kernel.graph_sections = (src.filename, tuple(src.regions))    # read by targets/cuda/graphs.py
        return kernel

    return _split(src, body, params, make, "")


def section_labels(sections, locs) -> list:
    """Per task (its ``file:line``): ``(region, section)`` of the parallel section it lies in,
    or None. ``sections``: a kernel's ``graph_sections`` (None: no region)."""
    if not sections:
        return [None] * len(locs)
    filename, regions = sections
    out = []
    for loc in locs:
        file, _, line = loc.rpartition(":")
        label = None
        if file == filename and line.isdigit():
            label = next(((r, s) for r, region in enumerate(regions) for s, (first, last) in enumerate(region)
                          if first <= int(line) <= last), None)
        out.append(label)
    return out


def dependencies(labels) -> list:
    """The graph nodes each task's node waits for (indices of earlier tasks), from
    :func:`section_labels`: a task outside a section waits for everything before it (a chain);
    the tasks of one section chain after the node before their region, concurrent with the
    other sections' chains, and the first task after the region waits for the end of every chain."""
    deps, frontier = [], []
    region, chains, base = None, {}, []
    for k, label in enumerate(labels):
        if label is not None and label[0] == region:
            section = label[1]
        else:
            if region is not None:      # the region ends: join its chains
                frontier = [node for tail in chains.values() for node in tail]
                region, chains = None, {}
            if label is not None:       # a region begins
                region, section, base = label[0], label[1], frontier
        if region is None:
            deps.append(frontier)
            frontier = [k]
        else:
            deps.append(chains.get(section, base))
            chains[section] = [k]
    return deps


def _split(src: _Source, body: list, params: dict, make_kernel, suffix: str):
    """The kernel running ``body`` (one level, regions unwrapped): plain when it holds no
    do_while loop, else a :class:`DoWhileKernel` of the parts around its first loop."""
    at = next((k for k, stmt in enumerate(body) if _loop_of(stmt)), None)
    if at is None:
        return make_kernel(_function(src, body, suffix))
    loop = body[at]
    flag = loop.test.args[0].id
    names = list(params)
    if flag not in params:
        raise src.error(loop, f"qd.graph.do_while({flag}): '{flag}' is not a parameter of the kernel (it takes "
                              "the name of a 0-d qd.i32 ndarray parameter)")
    before = body[:at]
    pre = make_kernel(_function(src, before, suffix + ".before_do_while")) if _does_something(before) else None
    loop_kernel = _split(src, loop.body, params, make_kernel, suffix + ".do_while")
    post = _split(src, body[at + 1:], params, make_kernel, suffix + ".after_do_while") \
        if _does_something(body[at + 1:]) else None
    return DoWhileKernel(src.name, pre, loop_kernel, post, names.index(flag), flag)


def _does_something(stmts) -> bool:
    return any(not isinstance(s, ast.Pass) and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               for s in stmts)


class DoWhileKernel:
    """A ``graph=True`` kernel with a ``qd.graph.do_while`` loop: its parts (kernels of the same
    parameters, see ``prepare``) run in order, the loop's body again while the flag is non-zero.
    On CUDA each part replays as a graph and the flag is read on the host after each pass
    (Quadrants' host-side fallback)."""

    graph = True

    def __init__(self, name, before, body, after, flag_index: int, flag_name: str):
        self.name = name
        self.before, self.body, self.after = before, body, after
        self.flag_index, self.flag_name = flag_index, flag_name
        self.parts = [k for k in (before, body, after) if k is not None]

    def __call__(self, *args, **kwargs):
        if kwargs.get("qd_stream") is not None:
            raise stream_error(self.name)
        kwargs.pop("qd_stream", None)
        args = self._bind(args, kwargs)
        flag = args[self.flag_index]
        if not isinstance(flag, Ndarray) and getattr(flag, "ndim", None) != 0:
            raise QuadrantsTypeError(f"kernel '{self.name}', argument '{self.flag_name}': qd.graph.do_while() needs "
                                     f"a 0-d qd.i32 ndarray, got {type(flag).__name__}")
        if self.before is not None:
            self.before(*args)
        while True:
            self.body(*args)
            if not _flag_value(flag):
                break
        if self.after is not None:
            self.after(*args)

    def _bind(self, args, kwargs):
        first = self.parts[0]
        while isinstance(first, DoWhileKernel):
            first = first.parts[0]
        return first._bind(args, kwargs)

    @property
    def grad(self):
        raise QuadrantsSyntaxError(f"kernel '{self.name}': a kernel with qd.graph.do_while() cannot be "
                                   "differentiated (kernel.grad)")

    def __get__(self, obj, cls=None):
        """A kernel method of a ``@qd.data_oriented`` class: ``obj`` is its ``self`` argument."""
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self):
        return f"<qd.kernel {self.name} (graph, do_while)>"


def _flag_value(flag) -> int:
    """The do_while flag's value on the host (a qd.ndarray is copied back; a numpy argument was
    copied back by the call)."""
    value = flag.to_numpy() if isinstance(flag, Ndarray) else flag
    return int(value.item() if hasattr(value, "item") else value)
