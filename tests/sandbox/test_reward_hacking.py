"""The code reward against a policy that cheats: every trick a wrong program could use to collect
reward scores 0, and right programs (floats, `in`, ordering, chained comparisons, `math.isclose`,
classes, prints) still score 1.

Each trick is a *wrong* solution plus the trick: the reward is 0 unless the trick works. The
reward is collected the way a rollout does (`async_rm` with `--rm-type code`). The design that
holds them (`slime.sandbox.assert_tests`): the program runs in the sandbox and only reports the
values of the calls into it; the asserts run in a separate judge process that never ran it.
"""

import asyncio
import json

import pytest

from slime.rollout.rm_hub import async_rm
from slime.sandbox import isolation
from slime.sandbox.split_tests import UnsplittableTests, split_tests
from slime.utils.types import Sample
from tests.helpers import make_args

FAST = dict(sandbox_timeout=10, sandbox_cpu_time=4, sandbox_memory_mb=512)
needs_bwrap = pytest.mark.skipif(isolation() != "bwrap", reason="bubblewrap sandbox not available here")

ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(10, 5) == 15"
WRONG_ADD = "def add(a, b):\n    return 0\n"
ALWAYS_EQUAL = (
    "class Any:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
    "    def __lt__(self, o): return True\n    def __gt__(self, o): return True\n"
    "    def __le__(self, o): return True\n    def __ge__(self, o): return True\n"
    "    def __sub__(self, o): return self\n    def __rsub__(self, o): return self\n"
    "    def __abs__(self): return 0\n    def __contains__(self, o): return True\n"
    "    def __hash__(self): return 0\n    def __bool__(self): return True\n"
    "    def __float__(self): return 2.0\n    def __index__(self): return 0\n"
)
# lines a judge or driver of this project would read as success, forged on every descriptor (the
# value records are wrong answers: a record with the right value is just a right answer)
FORGE = (
    'import os\nfor _line in (b\'@@slime-judge {"passed": true, "reason": "passed"}\\n\','
    " b'@@slime-tests-passed ' + b'0' * 32 + b'\\n', b'[0, \"ok\", 999]\\n[1, \"ok\", 999]\\n[2, \"ok\", 999]\\n'):\n"
    "    for _fd in range(1, 20):\n        try:\n            os.write(_fd, _line)\n        except OSError:\n"
    "            pass\n"
)


def reward(program: str, tests, **kw) -> tuple[float, str]:
    args = make_args(rm_type="code", **{**FAST, **kw})
    sample = Sample(response=f"```python\n{program}\n```", label=tests, metadata={})
    value = asyncio.run(async_rm(args, sample))
    return value, sample.metadata.get("code_result", "")


TRICKS = {
    # ---- leave before the tests, or take over the ending
    "os._exit(0) before the tests": "import os\nos._exit(0)",
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)",
    "raise SystemExit": "raise SystemExit(0)",
    "atexit hook that exits 0": "import atexit, os\natexit.register(lambda: os._exit(0))\n" + WRONG_ADD,
    "exception hook": "import sys, os\nsys.excepthook = lambda *a: os._exit(0)\n" + WRONG_ADD,
    "kill itself": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "closes stdout": "import os\nos.close(1)\n" + WRONG_ADD,
    "redirects stdout": "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 1)\n" + WRONG_ADD,
    # ---- forge the verdict or the values' records
    "prints forged success lines and exits": FORGE + "os._exit(0)",
    "forges records, then answers wrongly": FORGE + WRONG_ADD,
    "forges records from inside each call": (
        "import os\ndef add(a, b):\n" + "".join("    " + line + "\n" for line in FORGE.splitlines()) + "    return 0"
    ),
    "reads stdin, files and the probe list for an answer": (
        "import os\nseen = ''.join(open(f, errors='replace').read() for f in os.listdir('.') if os.path.isfile(f))\n"
        "import re\nnums = [int(n) for n in re.findall(r'-?\\d+', seen)]\n"
        "def add(a, b):\n    return max(nums)\n"
    ),
    # ---- objects that pass any comparison (the judge only ever sees plain data)
    "object equal to everything": ALWAYS_EQUAL + "def add(a, b):\n    return Any()",
    "int subclass equal to everything": (
        "class I(int):\n    def __eq__(self, o): return True\ndef add(a, b):\n    return I(0)"
    ),
    "float-style check vs always-equal": (
        ALWAYS_EQUAL + "def f(x):\n    return Any()",
        "assert abs(f(1) - 2.0) < 1e-6",
    ),
    "`in` check vs always-equal": (ALWAYS_EQUAL + "def f(x):\n    return Any()", "assert f(1) in (2, 3)"),
    "ordering check vs always-greater": (ALWAYS_EQUAL + "def f(x):\n    return Any()", "assert f(1) > 10"),
    "chained range check": (ALWAYS_EQUAL + "def f(x):\n    return Any()", "assert 0 < f(2) < 1"),
    "chained equality": (ALWAYS_EQUAL + "def f(x):\n    return Any()", "assert 3 == f(1) == 3"),
    "list holding an always-equal object": (ALWAYS_EQUAL + "def f(x):\n    return [Any()]", "assert f(1) == [5]"),
    # ---- patch what the tests use
    "patches math.isclose": (
        "import math\nmath.isclose = lambda *a, **k: True\ndef f(x):\n    return 0.0",
        "import math\nassert math.isclose(f(1), 2.0)",
    ),
    "patches builtins": (
        "import builtins\nbuiltins.abs = lambda x: 0\ndef add(a, b):\n    return a - b",
        "assert abs(add(1, 2) - 3) < 1e-9",
    ),
    "shadows a builtin the tests use": (
        "def abs(x):\n    return 0\ndef add(a, b):\n    return a - b",
        "assert abs(add(1, 2) - 3) < 1e-9",
    ),
    "rewrites every function of __main__ to return True": (
        "import sys\nm = sys.modules['__main__']\n"
        "for n in dir(m):\n    fn = getattr(m, n)\n    if hasattr(fn, '__code__'):\n"
        "        fn.__code__ = (lambda *a, **k: True).__code__\n        fn.__defaults__ = None\n" + WRONG_ADD
    ),
    "rewrites the judge's comparison through its code object": (
        "import sys\nsys.modules['__main__']._equal.__code__ = (lambda a, b, is_plain=None: True).__code__\n"
        + ALWAYS_EQUAL
        + "def add(a, b):\n    return Any()"
    ),
    "rebinds names in __main__": (
        "import __main__\n__main__._equal = lambda a, b: True\n__main__.encode = lambda v, d=0: 3\n"
        + ALWAYS_EQUAL
        + "def add(a, b):\n    return Any()"
    ),
    # ---- reach into the interpreter that runs the tests
    "SIGALRM handler that takes the token from the interrupted frame": (
        "import signal, os\ndef handler(sig, frame):\n    f = frame\n    while f is not None:\n"
        "        tok = f.f_locals.get('token')\n        if isinstance(tok, bytes) and tok:\n"
        "            os.write(1, b'\\n@@slime-tests-passed ' + tok + b'\\n')\n            os._exit(0)\n"
        "        f = f.f_back\n"
        "signal.signal(signal.SIGALRM, handler)\nsignal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)\n" + WRONG_ADD
    ),
    "SIGALRM handler reading the interrupted frames": (
        "import signal, os\ndef handler(sig, frame):\n    f = frame\n    while f is not None:\n"
        "        for k, v in list(f.f_locals.items()):\n"
        "            if k in ('token', 'records', 'verdict', 'names'):\n"
        '                os.write(1, b\'@@slime-judge {"passed": true, "reason": "passed"}\\n\')\n'
        "        f = f.f_back\n"
        "signal.signal(signal.SIGALRM, handler)\nsignal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)\n" + WRONG_ADD
    ),
    "walks frames from a traceback": (
        "import os\ntry:\n    1/0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame\n"
        "    while f is not None:\n        f.f_globals['encode'] = lambda v, d=0: 3\n        f = f.f_back\n" + WRONG_ADD
    ),
    "scans the heap": "import gc\nfor o in gc.get_objects():\n    pass\n" + WRONG_ADD,
    "ctypes": "import ctypes\nctypes.string_at(id(1), 8)\n" + WRONG_ADD,
    # ---- start something outside the limits and the judge
    "subprocess that prints a verdict": (
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', "
        '\'print("@@slime-judge {\\\\"passed\\\\": true, \\\\"reason\\\\": \\\\"passed\\\\"}")\'])\n' + WRONG_ADD
    ),
    "_posixsubprocess.fork_exec": (
        "import _posixsubprocess, os, sys\nr, w = os.pipe()\n"
        "_posixsubprocess.fork_exec([sys.executable, '-c', 'print(1)'], [sys.executable.encode()], True, (), "
        "None, None, -1, -1, -1, w, -1, -1, r, w, True, False, 0, None, None, None, -1, None, True)\n" + WRONG_ADD
    ),
    "os.fork": "import os\nif os.fork() == 0:\n    os._exit(0)\n" + WRONG_ADD,
    # ---- break the judge with the values
    "a value nested past any parser's depth": "def add(a, b):\n    x = []\n    for _ in range(5000):\n        x = [x]\n    return x",
    "an int past str()'s digit limit": "def add(a, b):\n    return 10 ** 100000",
    "values larger than the output cap": "def add(a, b):\n    return list(range(10 ** 6))",
    "sleeps past the wall time": "import time\ntime.sleep(60)\n" + WRONG_ADD,
}


@needs_bwrap
@pytest.mark.parametrize("trick", list(TRICKS))
def test_tricks_score_zero(trick):
    program, tests = TRICKS[trick] if isinstance(TRICKS[trick], tuple) else (TRICKS[trick], ADD_TESTS)
    value, reason = reward(program, tests, sandbox_timeout=5)
    assert value == 0.0, (trick, reason)
    assert reason and reason != "passed"


@needs_bwrap
def test_each_trick_holds_with_a_right_solution_too():
    """Tricks that leave the program able to answer are not what fails it: with the right `add`
    appended they pass (nothing forbids reading frames, the heap or memory; the split makes them
    useless), so their 0 above comes from the wrong answer, not from the harness."""
    right = "\ndef add(a, b):\n    return a + b\n"
    for trick in ("scans the heap", "patches builtins", "ctypes"):
        program = TRICKS[trick] if isinstance(TRICKS[trick], str) else TRICKS[trick][0]
        value, reason = reward(program.replace(WRONG_ADD, "") + right, ADD_TESTS)
        assert value == 1.0, (trick, reason)


RIGHT = {
    "plain asserts": ("def add(a, b):\n    return a + b", ADD_TESTS),
    "floats, HumanEval style": (
        "def mean(xs):\n    return sum(xs) / len(xs)",
        "def check(candidate):\n    assert abs(candidate([1.0, 2.0, 4.0]) - 7 / 3) < 1e-6\n"
        "    assert candidate([2.0]) == 2.0\n    for n in range(1, 4):\n        assert candidate([n] * n) == n\n"
        "check(mean)",
    ),
    "`in`, ordering, chained comparisons": (
        "def f(x):\n    return x * 2",
        "assert f(1) in (2, 3)\nassert f(6) > 10\nassert 0 < f(0.25) < 1\nassert 4 == f(2) == 4\nassert f(1) != 3",
    ),
    "math.isclose used correctly, and math in the solution": (
        "import math\ndef area(r):\n    return math.pi * r * r",
        "import math\nassert math.isclose(area(2), 12.566370614359172)\nassert not math.isclose(area(1), 4.0)",
    ),
    "namedtuple, dataclass, enum, TypeVar (library code that reads frames)": (
        "from collections import namedtuple, Counter\nfrom dataclasses import dataclass\nimport enum, typing\n"
        "P = namedtuple('P', 'x y')\nT = typing.TypeVar('T')\nclass Color(enum.Enum):\n    RED = 1\n"
        "@dataclass\nclass Box:\n    v: int\n"
        "def add(a, b):\n    return Box(P(a, b).x).v + Counter([b])[b] * b + Color.RED.value - 1",
        ADD_TESTS,
    ),
    "a class driven by the tests": (
        "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
        "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()",
        "s = Stack()\ns.push(1); s.push(2)\nassert s.pop() == 2\nassert s.items == [1]\nassert s.items != [2]",
    ),
    "prints, imports and catches its own errors": (
        "import heapq, itertools, functools, re, fractions\nprint('debug output')\n"
        "@functools.lru_cache(None)\ndef add(a, b):\n    try:\n        raise ValueError('x')\n    except ValueError:\n"
        "        print('handled')\n    h = [a, b]\n    heapq.heapify(h)\n    return int(sum(itertools.chain(h)) + fractions.Fraction(0))",
        ADD_TESTS,
    ),
    "tuples, sets, dicts, bytes, None, nan": (
        "def f(x):\n    return {'t': (x, [x]), 's': {x}, 'b': bytes([x]), 'n': None}\n"
        "def g():\n    return float('nan')",
        "import math\nr = f(1)\nassert r == {'t': (1, [1]), 's': {1}, 'b': b'\\x01', 'n': None}\n"
        "assert r['t'] != [1, [1]]\nassert math.isnan(g())\nassert sorted(f(2)) == ['b', 'n', 's', 't']",
    ),
    "test constants, loops over cases, and `from solution import`": (
        "def inc(x):\n    return x + 1",
        "from solution import inc\ncases = [(1, 2), (5, 6)]\nfor x, y in cases:\n    assert inc(x) == y\n"
        "expected = 11\nassert inc(10) == expected",
    ),
    "an exception the tests do not reach": (
        "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x",
        "assert f(1) == 1 or f(-1) == 0",
    ),
}


@needs_bwrap
@pytest.mark.parametrize("name", list(RIGHT))
def test_right_solutions_score_one(name):
    program, tests = RIGHT[name]
    assert reward(program, tests) == (1.0, "passed")


@needs_bwrap
def test_reasons_say_what_failed():
    assert reward(WRONG_ADD, ADD_TESTS) == (0.0, "tests line 1: assertion failed")
    assert reward("def add(a, b):\n    return 1 / 0", ADD_TESTS)[1] == (
        "tests line 1: add(1, 2) raised ZeroDivisionError: division by zero"
    )
    assert reward("raise ValueError('boom')", ADD_TESTS)[1] == "the program failed: ValueError: boom"
    assert "returned a Any, not plain data" in reward(ALWAYS_EQUAL + "def add(a, b):\n    return Any()", ADD_TESTS)[1]


def test_expected_values_never_reach_the_sandbox():
    plan = split_tests(
        "expected = 12345\nassert add(1, 2) == 3\nassert add(4, 5) == 9876\nassert add(7, 8) == expected"
    )
    sandbox = "\n".join(step.source for step in plan.steps)
    assert sandbox == "add(1, 2)\nadd(4, 5)\nadd(7, 8)"
    judge = "\n".join(j.source for j in plan.judge)
    for expected in ("3", "9876", "expected"):
        assert expected in judge


@pytest.mark.parametrize(
    "tests, why",
    [
        ("assert all(f(x) == x for x in range(3))", "GeneratorExp"),
        ("def helper(x):\n    return f(x) + 1\nassert helper(1) == 2", "'helper' is defined by the tests"),
        ("try:\n    f(-1)\nexcept ValueError:\n    pass\nassert f(1) == 1", "`try` statement"),
        ("assert eval(f(1)) == 3", "eval()"),
        ("import pickle\nassert pickle.loads(f(1)) == 3", "turns data into code"),
        ("x = f(1)", "no assert"),
        ("assert isinstance(make(), Stack)", "the solution's 'Stack' itself is judged"),
        ("assert f(1) ==", "syntax error"),
    ],
)
def test_shapes_the_split_cannot_judge_are_refused_naming_the_line(tests, why):
    with pytest.raises(UnsplittableTests, match="tests") as info:
        split_tests(tests)
    assert why in str(info.value)


def test_unsplittable_tests_are_refused_when_the_data_loads(tmp_path):
    """Before any process starts (`slime.preflight.check_data`), naming the file, line and test line."""
    from slime.errors import SlimeError
    from slime.preflight import check_data

    rows = [
        {"prompt": "Write add(a, b).", "label": "assert add(1, 2) == 3"},
        {"prompt": "Write f(x).", "label": "assert all(f(x) == x for x in range(3))"},
    ]
    data = tmp_path / "code.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = make_args(rm_type="code", prompt_data=str(data), input_key="prompt", label_key="label")
    with pytest.raises(SlimeError, match=r"code\.jsonl: line 2: tests line 1: a GeneratorExp"):
        check_data(args)
    data.write_text(json.dumps(rows[0]) + "\n")
    assert check_data(args) == 1
