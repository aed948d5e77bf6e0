"""Assert-style tests split into what runs beside the solution and what judges it.

The code reward never lets a solution share an interpreter with its judge: the solution's process
only *produces values*, and the asserts are decided in another process that has never run a line
of it. This module (host side, plain `ast`, nothing is executed) makes the split:

    assert abs(area(2) - 12.566) < 1e-3      ->  sandbox step:  area(2)
                                              ->  judge:         assert abs(<value 0> - 12.566) < 1e-3

* A *solution name* is one the tests use without defining it (and that is not a builtin). A name
  the tests assign from an expression that uses a solution name (`s = Stack()`) lives in the
  sandbox too.
* A *probe* is the shortest call/attribute/subscript chain rooted at such a name (`f(x)`,
  `s.pop()`, `f(x)[0]`, `s.items`): it is evaluated in the sandbox and comes back as plain data.
  Statements that use the solution for their effect (`s.push(1)`, `s = Stack()`) run there too,
  in the tests' order.
* Everything else (imports, constants, pure helper functions, the comparisons themselves) runs in
  the judge with the probes' values; the sandbox gets only the constants and imports its steps
  need, so an expected value that is not also an input never reaches the solution.

Common test shapes are rewritten first: HumanEval's `def check(candidate): ...` + `check(f)` is
inlined, and a `for` loop over literal cases (`range(...)`, a literal list, or a name bound to one)
is unrolled. What still cannot be split (a comprehension, lambda, `try`, `with` or helper function
that calls the solution) is refused with `UnsplittableTests` naming the line: the reward refuses the
data at load time rather than judge it where the solution could reach the judge.
"""

from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass
from typing import Any

# Modules whose import in a test marks the test's names as the solution's.
SOLUTION_MODULES = frozenset({"solution", "main", "__main__"})
# A judge that hands a probe's value to these would run code the solution wrote.
CODE_FROM_DATA = frozenset({"eval", "exec", "compile", "__import__", "breakpoint", "input", "open"})
CODE_FROM_DATA_MODULES = frozenset(
    {"pickle", "marshal", "shelve", "dill", "cloudpickle", "ctypes", "importlib", "runpy", "code", "codeop", "builtins"}
)
MAX_UNROLL = 1000  # steps a loop may unroll into
VALUE = "_slime_value"  # the judge's name for a probe's value: _slime_value(i)
_BUILTINS = frozenset(dir(builtins))
_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_NO_SPLIT = (*_SCOPES, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)


class UnsplittableTests(ValueError):
    """The tests have a shape the split cannot judge safely; the message names the line and why."""

    def __init__(self, line: int | None, reason: str):
        super().__init__(f"tests line {line}: {reason}" if line else f"tests: {reason}")


@dataclass(frozen=True)
class Step:
    """One thing the sandbox does, in the tests' order: `exec` a statement, or `eval` a probe."""

    kind: str  # "exec" | "eval"
    source: str
    line: int


@dataclass(frozen=True)
class JudgeStatement:
    source: str  # probes appear as _slime_value(i), i the index of the probe's step
    line: int


@dataclass(frozen=True)
class TestPlan:
    steps: tuple[Step, ...]
    judge: tuple[JudgeStatement, ...]
    asserts: int


def split_tests(source: str) -> TestPlan:
    """The plan for `source`; raises `UnsplittableTests` (a ValueError) for shapes it cannot split."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise UnsplittableTests(e.lineno, f"syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes; nesting past the parser's depth
        raise UnsplittableTests(None, f"cannot be parsed: {type(e).__name__}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == VALUE:
            raise UnsplittableTests(node.lineno, f"the name {VALUE!r} is reserved for the judge")
    body = _unroll(_inline_checks(tree.body), {})
    plan = _Splitter().run(body)
    if not plan.asserts:
        raise UnsplittableTests(None, "no assert statement: nothing would be judged")
    return plan


# ----------------------------------------------------------------------------- names in code


def _bound_inside(node: ast.AST) -> set[str]:
    """Names bound by comprehensions, lambdas and walruses within `node` (not free there)."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            names |= {n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name)}
        elif isinstance(sub, ast.Lambda):
            a = sub.args
            names |= {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p is not None}
        elif isinstance(sub, ast.NamedExpr):
            names.add(sub.target.id)
    return names


def _loads(node: ast.AST) -> set[str]:
    """Free names read by `node` (an expression or statement)."""
    read = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - _bound_inside(node)


def _stores(targets: list[ast.expr]) -> set[str]:
    """Names a statement's targets bind (`a, b = ...`; `a[0] = ...` binds none)."""
    names: set[str] = set()
    for t in targets:
        if isinstance(t, ast.Name):
            names.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            names |= _stores(list(t.elts))
        elif isinstance(t, ast.Starred):
            names |= _stores([t.value])
    return names


def _function_free_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    params = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p is not None}
    local = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    local |= {n.arg for n in ast.walk(fn) if isinstance(n, ast.arg)}  # nested functions' parameters
    local |= {n.name for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    defaults = set().union(*(_loads(d) for d in [*a.defaults, *a.kw_defaults] if d is not None))
    body = set().union(*(_loads(s) for s in fn.body)) if fn.body else set()
    return defaults | (body - params - local)


def _class_free_names(cls: ast.ClassDef) -> set[str]:
    free = set().union(*(_loads(e) for e in [*cls.bases, *cls.keywords, *cls.decorator_list]))
    stored = {cls.name}
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            free |= _function_free_names(stmt) | set().union(*(_loads(d) for d in stmt.decorator_list))
            stored.add(stmt.name)
        else:
            free |= _loads(stmt)
            stored |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return free - stored


class _Rename(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            return ast.copy_location(copy.deepcopy(self.values[node.id]), node)
        return node


# ----------------------------------------------------------------------- shapes made splittable


def _inline_checks(body: list[ast.stmt]) -> list[ast.stmt]:
    """HumanEval's shape: `def check(candidate): <asserts>` called once as `check(entry_point)` at the
    top level becomes the asserts with `candidate` replaced. Any function of positional parameters,
    called once as a statement with names or constants for arguments, is inlined the same way."""
    calls: dict[str, list[ast.Call]] = {}
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name):
            calls.setdefault(stmt.value.func.id, []).append(stmt.value)
    inline: dict[str, ast.FunctionDef] = {}
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef) and _inlinable(stmt, calls.get(stmt.name, []), body):
            inline[stmt.name] = stmt
    if not inline:
        return body
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name in inline:
            continue
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        if call is not None and isinstance(call.func, ast.Name) and call.func.id in inline:
            fn = inline[call.func.id]
            values = {p.arg: arg for p, arg in zip(fn.args.args, call.args, strict=True)}
            out += [_Rename(values).visit(copy.deepcopy(s)) for s in fn.body]
        else:
            out.append(stmt)
    return out


def _inlinable(fn: ast.FunctionDef, calls: list[ast.Call], body: list[ast.stmt]) -> bool:
    a = fn.args
    if len(calls) != 1 or fn.decorator_list or a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg or a.defaults:
        return False
    call = calls[0]
    if call.keywords or len(call.args) != len(a.args):
        return False
    if not all(isinstance(arg, (ast.Name, ast.Constant)) for arg in call.args):
        return False
    if any(isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal)) for n in ast.walk(fn)):
        return False
    # referenced anywhere but its one call (passed around, recursive): not a plain check function
    uses = sum(isinstance(n, ast.Name) and n.id == fn.name for s in body for n in ast.walk(s))
    return uses == 1


def _literal(node: ast.expr, literals: dict[str, Any]) -> tuple[bool, Any]:
    """(True, value) when `node` is a literal, `range(<ints>)`, or a name bound to a literal."""
    if isinstance(node, ast.Name) and node.id in literals:
        return True, literals[node.id]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "range"
        and not node.keywords
        and "range" not in literals
    ):
        ok = [_literal(a, literals) for a in node.args]
        if 1 <= len(ok) <= 3 and all(good and type(v) is int for good, v in ok):
            return True, range(*(v for _, v in ok))
        return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _const(value: Any) -> ast.expr:
    return ast.parse(repr(value), mode="eval").body


def _unroll(body: list[ast.stmt], literals: dict[str, Any]) -> list[ast.stmt]:
    """`for x in <literal cases>: <statements>` becomes the statements once per case, `x` replaced by
    the case's value (only where the loop needs it: the caller decides; here every such loop)."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            ok, value = _literal(stmt.value, literals)
            if ok:
                literals[stmt.targets[0].id] = value
            else:
                literals.pop(stmt.targets[0].id, None)
        if not isinstance(stmt, ast.For) or stmt.orelse:
            out.append(stmt)
            continue
        ok, cases = _literal(stmt.iter, literals)
        breaks = any(isinstance(n, (ast.Break, ast.Continue)) for n in ast.walk(stmt))
        if not ok or breaks or not isinstance(cases, (list, tuple, range, set, frozenset, str, dict)):
            out.append(stmt)
            continue
        cases = list(cases)
        if len(cases) * len(stmt.body) > MAX_UNROLL:
            out.append(stmt)
            continue
        bindings = [_bind(stmt.target, case) for case in cases]
        if any(b is None for b in bindings):
            out.append(stmt)
            continue
        for values in bindings:
            out += _unroll([_Rename(values).visit(copy.deepcopy(s)) for s in stmt.body], dict(literals))
    return out


def _bind(target: ast.expr, value: Any) -> dict[str, ast.expr] | None:
    if isinstance(target, ast.Name):
        return {target.id: _const(value)}
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)):
        if len(target.elts) != len(value):
            return None
        out: dict[str, ast.expr] = {}
        for t, v in zip(target.elts, value, strict=True):
            part = _bind(t, v)
            if part is None:
                return None
            out.update(part)
        return out
    return None


# ------------------------------------------------------------------------------------ the split


class _Splitter:
    def __init__(self) -> None:
        self.side: dict[str, str] = {}  # name -> "judge" | "sandbox", by the latest binding
        self.steps: list[tuple[int, Step]] = []  # (order, step) of the sandbox's own statements and probes
        self.pure: list[tuple[int, ast.stmt, set[str], set[str]]] = []  # (order, stmt, binds, reads)
        self.judge: list[JudgeStatement] = []
        self.asserts = 0
        self.order = 0

    def run(self, body: list[ast.stmt]) -> TestPlan:
        for stmt in body:
            self.order += 1
            self.statement(stmt)
        return self.plan()

    # which side a name is on
    def sandbox_name(self, name: str) -> bool:
        side = self.side.get(name)
        return side == "sandbox" if side else name not in _BUILTINS

    def touches(self, node: ast.AST) -> bool:
        return any(self.sandbox_name(n) for n in _loads(node))

    def statement(self, stmt: ast.stmt) -> None:
        line = stmt.lineno
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            return
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return self.imports(stmt)
        self.refuse_code_from_data(stmt)
        if isinstance(stmt, ast.Assert):
            self.asserts += 1
            test = _Probes(self, line).visit(copy.deepcopy(stmt.test)) if self.touches(stmt.test) else stmt.test
            return self.judge.append(JudgeStatement(ast.unparse(ast.Assert(test=test, msg=None)), line))
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if self.touches(stmt):  # `s = Stack()`, `s.x = 1`, `r = f(2)`: in the sandbox, and so are its names
                self.sandbox_step(stmt, line)
                self.side.update(dict.fromkeys(_stores(targets), "sandbox"))
            else:
                self.add_pure(stmt, _stores(targets))
            return
        if isinstance(stmt, ast.Expr) and self.touches(stmt):  # `s.push(1)`: for its effect
            return self.sandbox_step(stmt, line)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            free = _class_free_names(stmt) if isinstance(stmt, ast.ClassDef) else _function_free_names(stmt)
            if any(self.sandbox_name(n) for n in free - {stmt.name}):
                raise UnsplittableTests(
                    line,
                    f"{stmt.name!r} is defined by the tests and uses the solution; it cannot be split "
                    f"(the judge would have to call the solution): write the calls in the asserts",
                )
            return self.add_pure(stmt, {stmt.name})
        if self.touches(stmt):
            kind = type(stmt).__name__.lower()
            raise UnsplittableTests(
                line,
                f"a `{kind}` statement that uses the solution cannot be split (only asserts, assignments, "
                f"calls, and loops over literal cases can): write one assert per case",
            )
        self.add_pure(stmt, {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})

    def imports(self, stmt: ast.Import | ast.ImportFrom) -> None:
        modules = [stmt.module or ""] if isinstance(stmt, ast.ImportFrom) else [a.name for a in stmt.names]
        names = {(a.asname or a.name).split(".")[0] for a in stmt.names}
        if any(m.split(".")[0] in SOLUTION_MODULES for m in modules):
            # `from solution import f` / `import solution`: the sandbox runs it (its runner registers the
            # solution as those modules); the names it binds are the solution's
            self.sandbox_step(stmt, stmt.lineno)
            if "*" not in names:
                self.side.update(dict.fromkeys(names, "sandbox"))
            return
        if any(m.split(".")[0] in CODE_FROM_DATA_MODULES for m in modules):
            raise UnsplittableTests(stmt.lineno, f"the tests import {modules[0]!r}, which turns data into code")
        if "*" in names:
            raise UnsplittableTests(stmt.lineno, "`from ... import *` hides which names are the solution's")
        self.add_pure(stmt, names)

    def refuse_code_from_data(self, stmt: ast.stmt) -> None:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in CODE_FROM_DATA:
                if self.side.get(n.func.id) is None:
                    raise UnsplittableTests(
                        stmt.lineno, f"the tests call {n.func.id}(), which could run what the solution returned"
                    )

    def add_pure(self, stmt: ast.stmt, binds: set[str]) -> None:
        self.pure.append((self.order, stmt, binds, _loads(stmt)))
        self.side.update(dict.fromkeys(binds, "judge"))
        self.judge.append(JudgeStatement(ast.unparse(stmt), stmt.lineno))

    def sandbox_step(self, stmt: ast.stmt, line: int) -> None:
        self.steps.append((self.order, Step("exec", ast.unparse(stmt), line)))

    def probe(self, node: ast.expr, line: int) -> int:
        self.steps.append((self.order, Step("eval", ast.unparse(node), line)))
        return len(self.steps) - 1

    def plan(self) -> TestPlan:
        """The sandbox's steps, with the imports and constants they read (and only those) placed
        before them; probe indices in the judge are renumbered to the final step list."""
        needed: set[str] = set()
        for _, step in self.steps:
            tree = ast.parse(step.source)
            needed |= _loads(tree)  # and what `x += f(1)` reads before it binds:
            needed |= {
                t.id
                for n in ast.walk(tree)
                if isinstance(n, ast.AugAssign)
                for t in [n.target]
                if isinstance(t, ast.Name)
            }
        chosen: list[tuple[int, Step]] = []
        for order, stmt, binds, reads in reversed(self.pure):
            if binds & needed and not isinstance(stmt, ast.Assert):
                chosen.append((order, Step("exec", ast.unparse(stmt), stmt.lineno)))
                needed |= reads
        # a pure statement goes just before the first sandbox step of a later statement
        merged = sorted(
            [(order, 0, i, step) for i, (order, step) in enumerate(self.steps)]
            + [(order, -1, 0, step) for order, step in chosen],
            key=lambda t: (t[0], t[1], t[2]),
        )
        index = {i: n for n, (_, kind, i, _) in enumerate(merged) if kind == 0}
        renumber = _Renumber(index)
        judge = tuple(
            JudgeStatement(ast.unparse(renumber.visit(ast.parse(j.source))), j.line) if VALUE in j.source else j
            for j in self.judge
        )
        return TestPlan(steps=tuple(step for *_, step in merged), judge=judge, asserts=self.asserts)


class _Probes(ast.NodeTransformer):
    """Replaces each probe in an assert's expression by `_slime_value(i)`, recording it as a sandbox step."""

    def __init__(self, splitter: _Splitter, line: int):
        self.s = splitter
        self.line = line

    def visit(self, node: ast.AST) -> ast.AST:
        if not isinstance(node, ast.expr):
            return self.generic_visit(node)  # keyword arguments, comprehension clauses
        if not self.s.touches(node):
            return node
        if isinstance(node, ast.Call) and not self.s.touches(node.func):
            return self.generic_visit(node)  # abs(f(x) - 2.0): the judge calls abs on the value
        if isinstance(node, ast.Subscript) and not self.s.touches(node.value):
            return self.generic_visit(node)  # expected[f(1)]
        if isinstance(node, ast.Name) and node.id not in self.s.side:
            raise UnsplittableTests(
                self.line,
                f"the solution's {node.id!r} itself is judged (isinstance, callable, identity...): a class or "
                f"function cannot leave the sandbox as data; judge what calling it returns",
            )
        if isinstance(node, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)):
            i = self.s.probe(node, self.line)
            return ast.copy_location(ast.Call(ast.Name(VALUE, ast.Load()), [ast.Constant(i)], []), node)
        if isinstance(node, _NO_SPLIT):
            raise UnsplittableTests(
                self.line,
                f"a {type(node).__name__} that uses the solution inside an assert cannot be split "
                f"(its values would be judged where the solution runs): write one assert per case",
            )
        return self.generic_visit(node)


class _Renumber(ast.NodeTransformer):
    def __init__(self, index: dict[int, int]):
        self.index = index

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == VALUE:
            node.args[0] = ast.Constant(self.index[node.args[0].value])
        return node
