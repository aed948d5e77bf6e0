"""Runs inside the sandbox (its source is copied there as `main.py`): a solution, then its tests.

Protocol with the host (`slime.rollout.rm_hub.code`): standard input carries a random token made
for this run, then EOF; `solution.py` and `tests.py` are in the working directory. The driver
reads the token before any solution code runs, executes the solution as the `__main__` module,
then the tests against the solution's names, and only when the last test has passed writes
`MARK + token` to the standard output file descriptor and exits at once. Success is that line and
nothing else: an exit status means nothing, so a solution that exits early (`sys.exit`,
`os._exit`, `atexit` hooks, killing itself), replaces the exception hook, prints, or closes or
redirects its output gets 0, because it never sees the token.

What the solution could patch is taken out of its hands:
* the functions the driver needs (os.write, os._exit, exec) are held in locals before it runs;
* the builtins module is restored after it ran, and the tests see the real builtins, not the
  solution's top-level names that shadow them;
* `a == b` / `a != b` in the tests compare plain data (numbers, strings, bytes, None, and lists,
  tuples, dicts and sets of them, exact types) by value, and a plain value never equals an object
  of another type: an object whose `__eq__` always says True does not pass `assert f(x) == 4`;
* an audit hook (which Python code cannot remove) refuses what could find the token in memory or
  forge the driver's work: frame and garbage-collector introspection, tracing, ctypes, new code
  objects and marshal, and starting processes; the sandbox mounts no /proc for the driver (no
  /proc/self/mem), and the driver makes itself undumpable.
Left to the test author: tests that call library functions the solution can monkeypatch (e.g.
`math.isclose`) trust those functions.
"""

import ast
import builtins
import os
import sys

MARK = b"@@slime-tests-passed "

_PLAIN_SCALARS = frozenset({int, float, complex, str, bytes, bool, type(None)})
_PLAIN_CONTAINERS = frozenset({list, tuple, set, frozenset, dict})
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
_FRAME_EVENTS = frozenset({"sys._getframe", "sys._getframemodulename"})
_BLOCKED_EVENTS = frozenset(
    {
        "sys._current_frames",
        "sys._current_exceptions",
        "sys.settrace",
        "sys.setprofile",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "code.__new__",
        "marshal.loads",
        "marshal.load",
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "pty.spawn",
    }
)
# Standard-library modules that hand frames to their caller: frames asked for from these are refused
# like the solution's own requests. Other library code (namedtuple, enum, typing, warnings...) reads
# its caller's frame for its module name and keeps it to itself.
_FRAME_EXPOSING = (
    "inspect.py",
    "traceback.py",
    "logging/__init__.py",
    "pdb.py",
    "bdb.py",
    "asyncio/",
    "cgitb.py",
    "faulthandler",
    "code.py",
    "codeop.py",
)

# Everything below binds what it uses as default arguments: while the driver runs, this module is
# `sys.modules["__main__"]`, so the solution could rebind its globals, and builtins it can patch.


def _plain_checker(type=type, scalars=_PLAIN_SCALARS, containers=_PLAIN_CONTAINERS, dict_items=dict.items):
    def is_plain(x, depth=0):  # recursion through the closure cell, which no one else can reach
        t = type(x)
        if t in scalars:
            return True
        if t not in containers or depth > 50:
            return False
        if t is dict:
            for k, v in dict_items(x):
                if not (is_plain(k, depth + 1) and is_plain(v, depth + 1)):
                    return False
            return True
        for v in x:
            if not is_plain(v, depth + 1):
                return False
        return True

    return is_plain


_is_plain = _plain_checker()


def _equal(a, b, is_plain=_is_plain):
    """`a == b` as the tests mean it (see the module docstring)."""
    plain_a, plain_b = is_plain(a), is_plain(b)
    if plain_a and plain_b:
        return a == b
    if plain_a or plain_b:
        return False
    return a == b


class _GuardComparisons(ast.NodeTransformer):
    """`a == b` -> `_slime_equal(a, b)`, `a != b` -> `not _slime_equal(a, b)` (single comparisons)."""

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        call = ast.Call(func=ast.Name("_slime_equal", ast.Load()), args=[node.left, node.comparators[0]], keywords=[])
        new = call if isinstance(node.ops[0], ast.Eq) else ast.UnaryOp(ast.Not(), call)
        return ast.copy_location(new, node)


def _make_guard(
    stdlib,
    getframe=sys._getframe,
    denied=PermissionError,
    len=len,
    isinstance=isinstance,
    startswith=str.startswith,
    endswith=str.endswith,
    contains=str.__contains__,
):
    """The audit hook. It closes over everything it uses: no one can reach or rebind it."""
    busy = [False]  # its own sys._getframe call raises an event too

    def trusted_caller() -> bool:
        """Whether the code that raised the event is library code that keeps frames to itself."""
        busy[0] = True
        try:
            caller = getframe(2)  # 0: this function, 1: the hook, 2: the code that raised the event
        finally:
            busy[0] = False
        name = caller.f_code.co_filename
        if startswith(name, "<frozen "):
            return True
        if not startswith(name, stdlib) or contains(name, "site-packages"):
            return False
        for exposing in _FRAME_EXPOSING:
            if contains(name, exposing):
                return False
        return True

    def guard(event, args):
        if busy[0]:
            return
        if event in _BLOCKED_EVENTS or startswith(event, "ctypes."):
            raise denied(f"test driver: {event} is not allowed while tests run")
        frame_request = event in _FRAME_EVENTS or (
            event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRS
        )
        # a source file compiled under a standard-library name would pass for library code
        fake_library = (
            event == "compile"
            and len(args) > 1
            and isinstance(args[1], str)
            and (startswith(args[1], stdlib) or startswith(args[1], "<frozen "))
        )
        if (frame_request or fake_library) and not trusted_caller():
            what = f"reading .{args[1]}" if event == "object.__getattr__" else event
            raise denied(f"test driver: {what} is not allowed while tests run")

    return guard


def _undumpable():
    """Other processes of the same user cannot read this one's memory (PR_SET_DUMPABLE = 0)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _describe(
    e, base_str=BaseException.__str__, base=BaseException, type=type, name_of=type.__dict__["__name__"].__get__
):
    try:
        text = base_str(e)
    except base:
        text = ""
    name = name_of(type(e))
    return f"{name}: {text}"[:500] if text else name


def _main():
    read, write, exit_, run = os.read, os.write, os._exit, exec
    token = b""
    while True:
        chunk = read(0, 4096)
        if not chunk:
            break
        token += chunk
    with open("solution.py", encoding="utf-8") as f:
        solution = f.read()
    with open("tests.py", encoding="utf-8") as f:
        tests = f.read()
    try:
        solution_code = compile(solution, "solution.py", "exec")
        tests_code = compile(ast.fix_missing_locations(_GuardComparisons().visit(ast.parse(tests))), "tests.py", "exec")
    except SyntaxError as e:
        write(2, f"SyntaxError: {e}\n".encode())
        exit_(1)
    real_builtins = dict(builtins.__dict__)
    clear, update = builtins.__dict__.clear, builtins.__dict__.update
    equal, describe = _equal, _describe
    # Imports read no cached bytecode (marshal is refused below): modules compile from source.
    sys.pycache_prefix = "/nonexistent"
    namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": "solution.py"}
    _undumpable()
    import sysconfig

    sys.addaudithook(_make_guard(os.path.realpath(sysconfig.get_paths()["stdlib"]) + "/"))
    try:
        run(solution_code, namespace)
        clear()
        update(real_builtins)
        test_namespace = {k: v for k, v in namespace.items() if k not in real_builtins}
        # the tests get a private copy of the builtins: nothing the solution left running can patch it
        test_namespace.update(
            __name__="__main__", __builtins__=dict(real_builtins), __file__="tests.py", _slime_equal=equal
        )
        run(tests_code, test_namespace)
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: the tests did not finish
        try:
            write(2, (describe(e) + "\n").encode("utf-8", "replace"))
        finally:
            exit_(1)
    try:
        write(1, b"\n" + MARK + token + b"\n")
    finally:
        exit_(0)


if __name__ == "__main__":
    _main()
