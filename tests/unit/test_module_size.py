"""Small modules with one job each, and functions short enough to read at once: read from
the source with ``ast``, nothing imported.

- a module of ``ddprof_nb/`` has at most MAX_MODULE_LINES lines, unless its docstring has a
  line starting with "Size:" that says why it is one module; none has over HARD_MAX_LINES;
- a function or method (nested ones too) spans at most MAX_FUNCTION_LINES lines, from its
  ``def`` to its last line (decorators not counted, its docstring counted).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ddprof_nb"
MAX_MODULE_LINES = 600
HARD_MAX_LINES = 800  # no reason makes a module this long one job
MAX_FUNCTION_LINES = 80

SOURCES = sorted(PKG.rglob("*.py"))


def _size_reason(tree: ast.Module) -> str | None:
    doc = ast.get_docstring(tree) or ""
    for line in doc.splitlines():
        if line.strip().startswith("Size:"):
            return line.strip()
    return None


def test_the_package_is_read():
    # a wrong PKG would find nothing and pass everything
    assert len(SOURCES) > 50 and PKG / "model" / "profile.py" in SOURCES


def test_modules_are_small_or_say_why_not():
    big = []
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES and _size_reason(ast.parse(text)) is None:
            big.append(f"ddprof_nb/{path.relative_to(PKG)}: {lines} lines")
    assert not big, (f"over {MAX_MODULE_LINES} lines without a 'Size:' line in the module docstring "
                     "(split it by job, or say why it is one module):\n" + "\n".join(big))


def test_no_module_is_over_the_hard_limit():
    big = [f"ddprof_nb/{p.relative_to(PKG)}: {n} lines" for p in SOURCES
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > HARD_MAX_LINES]
    assert not big, f"over {HARD_MAX_LINES} lines, a Size: line or not (split it by job):\n" + "\n".join(big)


def test_a_size_line_is_a_reason_not_a_label():
    for path in SOURCES:
        reason = _size_reason(ast.parse(path.read_text(encoding="utf-8")))
        if reason is not None:
            assert len(reason.split()) >= 8, f"ddprof_nb/{path.relative_to(PKG)}: {reason!r} gives no reason"


def test_functions_are_short():
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"ddprof_nb/{path.relative_to(PKG)}:{node.lineno} {node.name}: {n} lines")
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n"
                      + "\n".join(long))
