import asyncio
import sys
import types

import pytest

from slime.errors import SlimeError
from slime.rollout import rm_hub
from slime.rollout.rm_hub import RM_TYPES, async_rm, batched_async_rm, validate_rm_type
from slime.rollout.rm_hub.math_utils import extract_boxed_answer, grade_math, is_equiv, normalize_answer
from slime.utils.types import Sample
from tests.helpers import make_args


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so \\boxed{65}", "65"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # the LAST box
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{{a}{b{c}}} tail", "{a}{b{c}}"),
        ("$\\boxed 5$", "5"),
        ("answer: \\boxed 42 done", "42"),
        ("\\boxed{7} and \\boxed 8", "8"),
        ("\\boxed {9}", "9"),
        ("\\fbox{3}", "3"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not count
        ("no answer here", None),
        ("", None),
        (None, None),
        ("\\boxed{6} then truncated \\boxed{6", None),  # unclosed last box
        ("\\boxed", None),
        ("\\boxedfoo{3}", None),
    ],
)
def test_extract_boxed_answer(text, expected):
    assert extract_boxed_answer(text) == expected


@pytest.mark.parametrize(
    "answer,label,equal",
    [
        ("65", "65", True),
        (" 65 ", "65", True),
        ("65.0", "65", True),
        ("65.", "65", True),
        ("$65$", "65", True),
        ("1,000", "1000", True),
        ("1,000,000.5", "1000000.5", True),
        ("\\text{65}", "65", True),
        ("\\text{ 6 5 }", "65", True),
        ("\\frac{1}{2}", "1/2", True),
        ("\\dfrac{1}{2}", "0.5", True),
        ("-3", "-3.00", True),
        ("\\left(1,2\\right)", "(1,2)", True),
        ("x+1", "x + 1", True),
        ("66", "65", False),
        ("1,00", "100", False),  # not a thousands separator
        ("6.5", "65", False),
        ("", "", False),
        ("x", "y", False),
    ],
)
def test_is_equiv(answer, label, equal):
    assert is_equiv(answer, label) is equal


def test_normalize_answer():
    assert normalize_answer("$\\boxed{1,234}$.") == "1234"
    assert normalize_answer(None) is None


def test_grade_math():
    assert grade_math("I think \\boxed{65}", "65") == 1.0
    assert grade_math("\\boxed{64} no wait \\boxed{65}", "65") == 1.0
    assert grade_math("\\boxed{65} no wait \\boxed{64}", "65") == 0.0
    assert grade_math("65", "65") == 0.0  # no boxed answer
    assert grade_math("\\boxed{65}", None) == 0.0
    assert grade_math("\\boxed{\\frac{3}{4}}", "0.75") == 1.0


def _args(**kw):
    return make_args(**{"rm_type": "math", **kw})


def test_async_rm_math():
    s_ok = Sample(response="\\boxed{65}<|end|>", label="65")
    s_bad = Sample(response="\\boxed{64}", label="65")
    s_none = Sample(response="65", label="65")
    assert asyncio.run(async_rm(_args(), s_ok)) == 1.0
    assert asyncio.run(batched_async_rm(_args(), [s_ok, s_bad, s_none])) == [1.0, 0.0, 0.0]
    # metadata rm_type overrides --rm-type per sample, and needs none
    s_meta = Sample(response="\\boxed{1}", label="1", metadata={"rm_type": "math"})
    assert asyncio.run(async_rm(_args(rm_type=None), s_meta)) == 1.0


def test_rm_type_validation():
    expected = {"math", "dapo", "deepscaler", "f1", "gpqa", "math_verify", "remote_rm", "code", "random", "ifbench"}
    assert set(RM_TYPES) == expected
    assert validate_rm_type("math") == "math"
    assert validate_rm_type("boxed_f1") == "boxed_f1"
    with pytest.raises(SlimeError, match=r"--rm-type 'boxed_nope'"):
        validate_rm_type("boxed_nope")
    with pytest.raises(SlimeError, match=r"did you mean 'dapo'"):
        validate_rm_type("dapp")
    with pytest.raises(SlimeError, match=r"--rm-type 'nope'.*known types: math"):
        validate_rm_type("nope")
    with pytest.raises(SlimeError, match="--rm-type 'nope'"):
        asyncio.run(async_rm(_args(rm_type="nope"), Sample(response="\\boxed{1}", label="1")))
    with pytest.raises(SlimeError, match="set --rm-type"):
        asyncio.run(async_rm(_args(rm_type=None), Sample()))


def test_custom_rm_path(monkeypatch):
    mod = types.ModuleType("my_test_rm_module")

    async def single(args, sample, **kw):
        return 0.5

    def batch(args, samples, **kw):  # sync functions work too
        return [float(len(s.response)) for s in samples]

    mod.single, mod.batch = single, batch
    monkeypatch.setitem(sys.modules, "my_test_rm_module", mod)
    assert asyncio.run(async_rm(_args(custom_rm_path="my_test_rm_module.single"), Sample())) == 0.5
    got = asyncio.run(
        batched_async_rm(_args(custom_rm_path="my_test_rm_module.batch"), [Sample(response="ab"), Sample()])
    )
    assert got == [2.0, 0.0]
    with pytest.raises(SlimeError, match="--custom-rm-path"):
        asyncio.run(async_rm(_args(custom_rm_path="my_test_rm_module.missing"), Sample()))
    assert rm_hub.grade_math is grade_math
