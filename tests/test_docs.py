"""The documentation's examples run: every ```python block of README.md, docs/*.md and
docs/guide/*.md.

One test per page (its id is the page's path): the page's blocks run in order in one fresh
namespace, on the suite's arch (``qd.init`` is called again before each page, so a page that
calls ``qd.init(debug=True)`` leaves nothing behind). A block whose info string is
``python skip`` is shown but not run: GPU-only code, or output-only snippets.

Each block is compiled with the page's path as its file name, padded so that its line numbers
are the page's own, and the page's text is registered in ``linecache``: tracebacks, and
qd_numba's error messages (which read source lines through linecache), point at the line of
the page. Kernels defined in such ``exec``'d code compile like any other: the frontend reads
bytecode, not source.
"""

from __future__ import annotations

import glob
import linecache
import os
import re
from dataclasses import dataclass

import pytest

import qd_numba as qd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OPEN_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    line: int       # the page's line number of the block's first code line
    code: str
    info: str       # the fence's info string, e.g. "python", "python skip", "bash"


def code_blocks(text: str) -> list[Block]:
    """Every fenced code block of a markdown text (CommonMark fences: ``` or ~~~, the opening
    fence indented by at most 3 spaces, closed by a fence of the same character at least as
    long; an unclosed block runs to the end of the text)."""
    lines = text.splitlines()
    blocks, k = [], 0
    while k < len(lines):
        m = _OPEN_FENCE.match(lines[k])
        if m is None:
            k += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = k + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        body = [_dedent(line, indent) for line in lines[k + 1:end]]
        blocks.append(Block(k + 2, "\n".join(body) + "\n", m["info"].strip()))
        k = end + 1
    return blocks


def _dedent(line: str, indent: int) -> str:
    """Drop up to ``indent`` leading spaces (the opening fence's indentation)."""
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(stripped, indent):]


def run_page(path: str, text: str, namespace: dict) -> int:
    """Run the ``python`` blocks of a page in ``namespace``; returns how many ran. A failing
    block raises AssertionError naming the page and the block's line, chained to the error."""
    linecache.cache[path] = (len(text), None, text.splitlines(keepends=True), path)
    ran = 0
    for block in code_blocks(text):
        if block.info != "python":
            continue
        code = compile("\n" * (block.line - 1) + block.code, path, "exec")
        try:
            exec(code, namespace)
        except Exception as e:
            raise AssertionError(f"{path}: the python block at line {block.line} failed: "
                                 f"{type(e).__name__}: {e}") from e
        ran += 1
    return ran


def doc_pages() -> list[str]:
    """README.md, docs/*.md and docs/guide/*.md that have at least one block to run."""
    pages = [os.path.relpath(p, ROOT).replace(os.sep, "/")
             for pattern in ("README.md", "docs/*.md", "docs/guide/*.md")
             for p in sorted(glob.glob(os.path.join(ROOT, pattern)))]
    return [p for p in pages if any(b.info == "python" for b in code_blocks(_read(p)))]


def _read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("page", doc_pages())
def test_page_examples_run(page, arch):
    qd.init(arch=qd.cuda if arch == "cuda" else qd.cpu)
    try:
        assert run_page(page, _read(page), {"__name__": page[:-3].replace("/", ".")}) > 0
    finally:
        qd.init(arch=qd.cuda if arch == "cuda" else qd.cpu)


# -- the runner itself ---------------------------------------------------------------------------

SAMPLE = """# A page

Text, then a block that runs:

```python
import numpy as np
import qd_numba as qd
values = np.arange(4.0)
```

- a list item with an indented block, shown but not run:

  ```python skip
  raise RuntimeError("skipped blocks never run")
  ```

````python
fence = "longer fences may contain ```"
````

```bash
exit 1
```

~~~python
total = values.sum() + len(fence)
~~~
"""


def test_code_blocks_are_found_with_their_page_lines():
    blocks = code_blocks(SAMPLE)
    assert [(b.line, b.info) for b in blocks] == [
        (6, "python"), (14, "python skip"), (18, "python"), (22, "bash"), (26, "python")]
    assert blocks[1].code == 'raise RuntimeError("skipped blocks never run")\n'
    assert blocks[2].code == 'fence = "longer fences may contain ```"\n'
    lines = SAMPLE.splitlines()
    assert all(lines[b.line - 1].strip() == b.code.splitlines()[0].strip() for b in blocks)


def test_blocks_of_a_page_share_one_namespace():
    ns = {"__name__": "sample"}
    assert run_page("sample.md", SAMPLE, ns) == 3
    assert ns["total"] == 6.0 + len(ns["fence"])


def test_failing_block_names_the_page_and_line():
    page = "# p\n\n```python\nx = 1\n```\n\n```python\ny = 2\nz = x / 0\n```\n"
    with pytest.raises(AssertionError, match=r"bad\.md: the python block at line 8 failed: ZeroDivisionError") as info:
        run_page("bad.md", page, {})
    tb = info.value.__cause__.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert (tb.tb_frame.f_code.co_filename, tb.tb_lineno) == ("bad.md", 9)


KERNEL_PAGE = """# Kernels in a page

```python
import numpy as np
import qd_numba as qd

@qd.kernel
def scale(a: qd.types.ndarray(dtype=qd.f64, ndim=1), s: qd.f64):
    for i in a:
        a[i] = a[i] * s
```

```python
@qd.kernel
def leak(a: qd.types.ndarray(dtype=qd.f64, ndim=1)) -> qd.f64:
    s = 0.0
    for i in a:
        s = a[i]
    return s
```
"""


def test_kernel_in_a_page_compiles_runs_and_errors_quote_the_page(rng):
    ns = {"__name__": "kernel_page"}
    run_page("kernels_page.md", KERNEL_PAGE, ns)
    a = rng.uniform(-1, 1, 50)
    ref = a * 1.5
    ns["scale"](a, 1.5)
    assert (a == ref).all()
    assert ns["scale"].tasks(a, 1.5)[0].loc == "kernels_page.md:9"
    with pytest.raises(qd.QuadrantsSyntaxError, match="read after it") as info:
        ns["leak"](a)
    assert 'File "kernels_page.md", line 18\n    s = a[i]' in str(info.value)
