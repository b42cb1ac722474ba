"""The package's layering, checked on its import graph (every import, lazy ones included).

* passes never import the kernel front end, a target or the runtime (a pass works on IR and
  Tasks only, on any target's IR classes);
* typing/ and lowering/ never import the kernel, the targets, the runtime or the front end;
* no import cycles. Where a lower layer needs something of a higher one, the higher one hands it
  down: the Python-scope ``Matrix`` class sets ``MatrixType.python_class`` (boxing, ``vec3(...)``),
  kernel.py registers with ``runtime.on_init``, and targets are found through the registry of
  targets/base.py (by module name).
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "qd_numba"


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def _imports(mods) -> dict[str, set[str]]:
    edges = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if not base.startswith("qd_numba"):
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    out.add(full if full in mods else base)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("qd_numba"))
        # importing a.b.c runs a/__init__ and a/b/__init__ first: edges to the parent packages too
        with_parents = set()
        for m in out:
            parts = m.split(".")
            with_parents.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
        edges[name] = {m for m in with_parents if m in mods and m != name and not name.startswith(m + ".")}
    return edges


EDGES = _imports(_modules())


def _violations(prefixes, forbidden):
    return sorted((m, dep) for m, deps in EDGES.items() if m.startswith(prefixes)
                  for dep in deps if dep == "qd_numba" or dep.startswith(forbidden))


def test_passes_never_import_the_front_end_targets_or_runtime():
    assert _violations(("qd_numba.passes",), ("qd_numba.kernel", "qd_numba.targets", "qd_numba.runtime")) == []


def test_typing_and_lowering_never_import_python_scope_machinery():
    forbidden = ("qd_numba.kernel", "qd_numba.targets", "qd_numba.runtime", "qd_numba.frontend",
                 "qd_numba.passes")
    assert _violations(("qd_numba.typing", "qd_numba.lowering"), forbidden) == []


def _cyclic_modules() -> set[str]:
    """Modules on an import cycle (members of a strongly connected component of size > 1)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), set()
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.update(component)

    for v in EDGES:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cyclic = _cyclic_modules()
    assert cyclic == set(), f"modules on an import cycle: {sorted(cyclic)}"
