"""How many of Quadrants' public API names resolve on qd_numba.

Reads the Quadrants wheel's Python sources statically (never imports Quadrants): the names that
``quadrants``, ``quadrants.lang``, ``quadrants.math`` and ``quadrants.types`` export — a module's
literal ``__all__``, or else what it defines and imports (star imports followed through the
imported module's exports), less private names and less what a computed ``__all__`` leaves out —
then checks each name with ``hasattr`` on the matching qd_numba namespace. Resolving is not
working: docs/quadrants_compat.md says what each name does.

    python bench/compat_names.py [path/to/quadrants-*.whl] > bench/results/compat_names.md
"""

from __future__ import annotations

import ast
import glob
import importlib
import sys
import zipfile

NAMESPACES = {"quadrants": "qd_numba", "quadrants.lang": "qd_numba.lang", "quadrants.math": "qd_numba.math",
              "quadrants.types": "qd_numba.types"}
EXTRA = {"quadrants": {"cfg", "outer"}}   # quadrants/__init__.py's module __getattr__


class Wheel:
    def __init__(self, path: str):
        self.zip = zipfile.ZipFile(path)
        self.files = set(self.zip.namelist())
        self._exports: dict[str, set[str]] = {}

    def source(self, module: str) -> tuple[ast.Module, bool] | None:
        base = module.replace(".", "/")
        for path, is_package in ((f"{base}/__init__.py", True), (f"{base}.py", False)):
            if path in self.files:
                return ast.parse(self.zip.read(path)), is_package
        return None

    def exports(self, module: str, follow_all: bool = True) -> set[str]:
        """The public names of ``module``: its literal ``__all__`` when ``follow_all``, else
        what it defines and imports."""
        key = f"{module}:{follow_all}"
        if key in self._exports:
            return self._exports[key]
        self._exports[key] = set()   # an import cycle ends here
        parsed = self.source(module)
        if parsed is None:
            return set()
        tree, is_package = parsed
        literal, left_out, names = None, set(), set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                    for t in node.targets):
                if isinstance(node.value, (ast.List, ast.Tuple)):
                    literal = {ast.literal_eval(e) for e in node.value.elts}
                else:   # a computed __all__: the lists it names are left out
                    for sub in ast.walk(node.value):
                        if isinstance(sub, (ast.List, ast.Tuple)):
                            left_out |= {e.value for e in sub.elts if isinstance(e, ast.Constant)}
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Delete):
                names -= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.ImportFrom):
                source = self._resolve(module, is_package, node)
                for alias in node.names:
                    if alias.name == "*":
                        names |= self.exports(source)
                    else:
                        names.add(alias.asname or alias.name)
        result = literal if follow_all and literal is not None else names - left_out
        result = {n for n in result if not n.startswith("_")}
        self._exports[key] = result
        return result

    @staticmethod
    def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else sorted(glob.glob("/work/main/.whlq/quadrants-*.whl"))[-1]
    wheel = Wheel(path)
    total = resolved = 0
    lines = []
    for quadrants_name, ours in NAMESPACES.items():
        # a package's own __all__ is a subset of what `qd.X` reaches: list everything it binds
        names = wheel.exports(quadrants_name, follow_all=False) | EXTRA.get(quadrants_name, set())
        target = importlib.import_module(ours)
        missing = sorted(n for n in names if not hasattr(target, n))
        total += len(names)
        resolved += len(names) - len(missing)
        lines.append(f"## `{quadrants_name}` -> `{ours}`: {len(names) - len(missing)} / {len(names)} resolve\n")
        lines.append("Missing: " + (", ".join(f"`{n}`" for n in missing) or "none") + "\n")
    print(f"# Quadrants public API names on qd_numba\n\nFrom `{path.rsplit('/', 1)[-1]}` (read statically, "
          f"bench/compat_names.py). **{resolved} / {total}** names resolve ({100 * resolved / total:.0f}%); "
          "resolving is not the same as working (docs/quadrants_compat.md).\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
