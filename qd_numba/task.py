"""The Task: one offloaded unit of a kernel (a parallel range-for, or serial code).

Tasks are what the rest of the system talks about — introspection, fusion, the targets.
A task's ``uid`` is derived from (kernel qualified name, task index) only, so it is the
same in every process and can key on-disk caches.
"""

from __future__ import annotations

import dataclasses
import hashlib


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A range-for task's iteration space: per dimension a ``(start, stop, step)`` of size
    expressions (passes/bounds.py says their form), or ``dims`` None when the analysis could not
    describe it (the loop still runs: its count is computed at launch); ``text`` is for people."""

    dims: tuple | None
    text: str

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class Task:
    index: int
    kind: str                       # "range_for" | "serial"
    name: str                       # e.g. "mymod.step.t1_range_for"
    uid: str                        # content-stable id (hex)
    bounds: Bounds | None = None    # range_for: the iteration space (size expressions)
    ndim: int = 0                   # range_for: dimensions of the iteration space
    loc: str = ""                   # file:line of the loop (or of the first serial statement)
    serialize: bool = False         # qd.loop_config(serialize=True): run on one thread
    header: int | None = None       # range_for: loop header label in the kernel IR
    body: frozenset = frozenset()   # labels of the blocks the task owns in the kernel IR
    fused_from: tuple = ()          # range_for made by fusion: file:line of each source loop, in order
    accesses: tuple = ()            # accesses.Access per access to global data (address fingerprints)
    reads: frozenset = frozenset()  # names of the fields/ndarray arguments the task reads
    writes: frozenset = frozenset()  # ... and writes (stores, atomics, unknown uses)
    stream_group: int = 0           # its qd.stream_parallel() block (1, 2, ...; 0: none): docs/streams.md
    # variable -> Numba type on the target that compiled the task (passes/task_types.py); None
    # before typing. Not part of the task's identity: the Task list is the same on every target
    types: dict | None = dataclasses.field(default=None, compare=False, repr=False)

    @staticmethod
    def make(kernel_qualname: str, index: int, kind: str, **fields) -> Task:
        name = f"{kernel_qualname}.t{index}_{kind}"
        uid = hashlib.sha256(f"{kernel_qualname}\0{index}".encode()).hexdigest()[:16]
        return Task(index=index, kind=kind, name=name, uid=uid, **fields)

    def renumbered(self, index: int, **changes) -> Task:
        """This task at another position of its kernel (name and uid follow the index)."""
        prefix = self.name.rsplit(".t", 1)[0]
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("index", "kind", "name", "uid")}
        return Task.make(prefix, index, self.kind, **{**fields, **changes})

    def describe(self) -> str:
        extra = f" over {self.bounds}" if self.kind == "range_for" else ""
        if self.fused_from:
            extra += f", fused from {len(self.fused_from)} loops ({', '.join(self.fused_from)})"
        return f"task {self.index} [{self.kind}]{extra} at {self.loc}"
