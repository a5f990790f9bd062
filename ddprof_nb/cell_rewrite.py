"""How a ``%%ddprof`` cell is rewritten to run as an ordinary cell (see ``magics``).

``cell_transform`` (an input transformer) replaces the ``%%ddprof ARGS`` line by a marker
statement of the same line count; ``CellWrapper`` (an AST transformer) turns a module
starting with that marker into ``try: begin(ARGS); <cell>; keep(last) finally: end()``
followed by ``result()``, calling the hooks object at ``get_ipython().<HOOKS_ATTR>``.
"""

from __future__ import annotations

import ast
import re

__all__ = ["cell_transform", "CellWrapper", "MARKER", "HOOKS_ATTR"]

MARKER = "__cell__"
HOOKS_ATTR = "_ddprof_cell"
CELL_LINE = re.compile(r"^%%ddprof(?:[ \t]+(?P<args>.*?))?[ \t]*(?:\r?\n)?$")


def cell_transform(lines: list[str]) -> list[str]:
    """Input transformer: ``%%ddprof ARGS`` (first line) -> the marker statement."""
    if not lines or not lines[0].startswith("%%ddprof"):
        return lines
    m = CELL_LINE.match(lines[0])
    if m is None:
        return lines
    args = (m.group("args") or "").strip()
    marker = f"get_ipython().run_line_magic('ddprof', {(MARKER + ' ' + args).rstrip()!r})\n"
    return [marker] + lines[1:]


def _hook_call(method: str, *args: ast.expr) -> ast.Call:
    hooks = ast.Attribute(ast.Call(ast.Name("get_ipython", ast.Load()), [], []), HOOKS_ATTR, ast.Load())
    return ast.Call(ast.Attribute(hooks, method, ast.Load()), list(args), [])


def _marker_args(node: ast.stmt) -> str | None:
    """ARGS if ``node`` is the marker statement, else None."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return None
    call = node.value
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "run_line_magic" and isinstance(f.value, ast.Call)
            and isinstance(f.value.func, ast.Name) and f.value.func.id == "get_ipython"):
        return None
    if len(call.args) != 2 or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args):
        return None
    name, line = call.args[0].value, call.args[1].value
    if name != "ddprof" or not (line == MARKER or line.startswith(MARKER + " ")):
        return None
    return line[len(MARKER):].strip()


class CellWrapper(ast.NodeTransformer):
    """AST transformer: a module starting with the marker -> the try/finally form."""

    def __init__(self, shell):
        super().__init__()
        self.shell = shell

    def visit(self, node):  # only the module matters; never descend
        if isinstance(node, ast.Module):
            try:
                return self._wrap(node)
            except Exception:  # noqa: BLE001 - IPython would unregister a failing transformer
                return node
        return node

    def _wrap(self, module: ast.Module) -> ast.Module:
        body = module.body
        if not body:
            return module
        args = _marker_args(body[0])
        if args is None:
            return module
        marker = body[0]
        rest = list(body[1:])
        futures = []
        while rest and isinstance(rest[0], ast.ImportFrom) and rest[0].module == "__future__":
            futures.append(rest.pop(0))
        begin = ast.Expr(_hook_call("begin", ast.Constant(args)))
        ast.copy_location(begin, marker)
        mode = getattr(self.shell, "ast_node_interactivity", "last_expr")
        tail: list[ast.stmt] = []
        if rest and mode in ("last_expr", "last", "last_expr_or_assign"):
            last = rest[-1]
            target = None
            if isinstance(last, ast.Expr):
                keep = ast.Expr(_hook_call("keep", last.value))
                rest[-1] = ast.copy_location(keep, last)
                target = last
            elif mode == "last_expr_or_assign":
                name = None
                if isinstance(last, ast.Assign) and len(last.targets) == 1 and isinstance(last.targets[0], ast.Name):
                    name = last.targets[0].id
                elif isinstance(last, (ast.AugAssign, ast.AnnAssign)) and isinstance(last.target, ast.Name) \
                        and getattr(last, "value", True) is not None:
                    name = last.target.id
                if name is not None:
                    rest.append(ast.copy_location(ast.Expr(_hook_call("keep", ast.Name(name, ast.Load()))), last))
                    target = last
            if target is not None:
                tail.append(ast.copy_location(ast.Expr(_hook_call("result")), target))
        end = ast.copy_location(ast.Expr(_hook_call("end")), marker)
        wrapped = ast.Try(body=[begin] + rest, handlers=[], orelse=[], finalbody=[end])
        ast.copy_location(wrapped, marker)
        module.body = futures + [wrapped] + tail
        ast.fix_missing_locations(module)
        return module
