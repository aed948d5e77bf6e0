"""Runs inside the sandbox (its source is copied there as `main.py`): the solution, then the probes.

Never imported by the host. `solution.py` and `probes.json` (the sandbox's steps of
`slime.sandbox.split_tests`: `["exec", statement]` or `["eval", expression]`) are in the working
directory. The solution runs as a module of its own; the steps run in a copy of its namespace (a
test's `x = 3` does not rebind the solution's globals), in order. Each `eval` step's value goes to
the standard output as one JSON line, `[index, "ok", <plain data>]`, or `[index, "raised",
"<exception>"]`; a value that is not plain data (None, bool, int, float, complex, str, bytes and
lists, tuples, sets, frozensets and dicts of them, exact types only) is
`[index, "not-plain", "<type>"]`. A failing `exec` step ends the run with its record.

Nothing here is a defence: the solution shares this interpreter and may write whatever lines it
likes. That is harmless by design: a line can only claim a value for a probe, which is what the
solution's functions return anyway, and the judge that compares values runs in another process
with the expected values the sandbox never sees. The solution's own prints go to /dev/null so
that an honest program that prints does not garble the records.
"""

import json
import os
import sys
import types

_SCALARS = (type(None), bool, int, float, str)


def encode(value, depth=0):
    """Plain data as JSON: scalars as themselves; others tagged (`{"tuple": [...]}`...)."""
    t = type(value)
    if depth > 100:
        raise ValueError("nested deeper than 100")
    if t in _SCALARS:
        return value
    if t is bytes:
        return {"bytes": value.hex()}
    if t is complex:
        return {"complex": [value.real, value.imag]}
    if t in (list, tuple, set, frozenset):
        return {t.__name__: [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(t.__name__)


def describe(e):
    try:
        text = str(e)
    except BaseException:  # noqa: BLE001 - a solution's exception may fail to print
        text = ""
    name = type(e).__name__
    return f"{name}: {text}"[:300] if text else name


def main():
    out = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)

    def emit(record):
        os.write(out, (json.dumps(record, allow_nan=True) + "\n").encode())

    with open("probes.json", encoding="utf-8") as f:
        steps = json.load(f)
    with open("solution.py", encoding="utf-8") as f:
        source = f.read()
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    namespace = module.__dict__
    sys.modules["solution"] = sys.modules["main"] = module  # `from solution import f` in the tests
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as e:  # noqa: BLE001 - SystemExit too: the program did not define its names
        emit([-1, "raised", describe(e)])
        return
    names = dict(namespace)
    for index, (kind, code) in enumerate(steps):
        try:
            if kind == "exec":
                exec(code, names)
                continue
            value = eval(code, names)
        except BaseException as e:  # noqa: BLE001
            emit([index, "raised", describe(e)])
            if kind == "exec":
                return
            continue
        try:
            emit([index, "ok", encode(value)])
        except (TypeError, ValueError, RecursionError) as e:  # not plain; an int past str()'s digit limit
            emit([index, "not-plain", str(e)[:100]])


if __name__ == "__main__":
    main()
