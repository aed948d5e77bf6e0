"""`slime report`'s axis ticks (slime.observability.report_ticks): labels that tell ticks apart over
narrow ranges, and the page's JavaScript copy of the algorithm (report_assets.TICKS_JS), run under
node, giving the same ticks."""

from __future__ import annotations

import json
import random
import shutil
import subprocess

import pytest

from slime.observability import report
from slime.observability.report_assets import PAGE_JS, TICKS_JS
from slime.observability.report_ticks import axis, nice_step, tick_label, y_range

# (lo, hi, n, min_step): narrow, wide, negative, tiny, huge, integer x axes
CASES = [
    (5.75145, 5.75255, 4, 0.0),
    (0.0, 1.0, 4, 0.0),
    (-0.37, 0.12, 4, 0.0),
    (0.2999, 0.3001, 4, 0.0),
    (1e-7, 9e-7, 4, 0.0),
    (-3e-8, 3e-8, 4, 0.0),
    (1_200_000.0, 1_260_000.0, 4, 0.0),
    (-5e9, 5e9, 4, 0.0),
    (12.5, 12.5000004, 4, 0.0),
    (0.5, 1.5, 6, 1.0),
    (1.0, 1000.0, 6, 1.0),
    (6.0, 26.0, 6, 1.0),
    (-0.14, 2.46, 4, 0.0),
    (1e-5, 5e-5, 4, 0.0),
]


def _random_cases(n: int) -> list[tuple[float, float, int, float]]:
    """Ranges of every magnitude and width, around every centre (seeded)."""
    rng = random.Random(0)
    out = []
    for _ in range(n):
        centre = rng.choice([-1, 1]) * 10 ** rng.uniform(-9, 9) * rng.random()
        width = 10 ** rng.uniform(-10, 10)
        out.append((centre, centre + width, rng.choice([4, 6]), rng.choice([0.0, 0.0, 1.0])))
    return out


def test_step_decides_the_decimals():
    assert nice_step(0.0016, 4) == (5, -4)  # step 0.0005
    assert nice_step(0.0011, 4) == (2, -4)
    assert [label for _, label in axis(5.7515, 5.7531, 4)] == ["5.7515", "5.7520", "5.7525", "5.7530"]
    assert [label for _, label in axis(0.0, 1.0, 4)] == ["0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    assert [label for _, label in axis(6.0, 26.0, 6, 1.0)] == ["10", "15", "20", "25"]  # x: whole steps
    assert [label for _, label in axis(0.5, 1.5, 6, 1.0)] == ["1"]  # never a step under 1


def test_labels_are_exact_and_distinct_over_any_range():
    for lo, hi, n, min_step in CASES + _random_cases(300):
        ticks = axis(lo, hi, n, min_step)
        labels = [label for _, label in ticks]
        assert len(ticks) <= 2 * n + 1, (lo, hi)
        # no tick only where the step (>= 1) is wider than the range, or floats cannot tell ticks apart
        assert ticks or min_step > hi - lo or hi - lo < 1e-14 * max(abs(lo), abs(hi)), (lo, hi)
        assert len(set(labels)) == len(labels), (lo, hi, labels)  # the entropy bug: "5.752" four times
        slack = 1e-9 * max(hi - lo, min_step)
        assert all(lo - slack <= v <= hi + slack for v, _ in ticks), (lo, hi)
        for v, label in ticks:
            assert float(label) == pytest.approx(v, rel=1e-12, abs=1e-300), (label, v)


def test_label_forms():
    assert tick_label(57520, -4) == "5.7520"
    assert tick_label(-5, -4) == "-0.0005"
    assert tick_label(0, -4) == "0"
    assert tick_label(12, 5) == "1200000"
    assert tick_label(125, 4, exponent=True) == "1.25e6"
    assert tick_label(-25, -8, exponent=True) == "-2.5e-7"
    assert [label for _, label in axis(1_200_000.0, 1_260_000.0, 4)][:2] == ["1.20e6", "1.22e6"]
    assert [label for _, label in axis(12.5, 12.5000004, 4)][0] == "12.5000000"  # fixed-point, not 1.25e1
    assert [label for _, label in axis(1e-5, 5e-5, 4)] == ["1e-5", "2e-5", "3e-5", "4e-5", "5e-5"]
    assert axis(1.0, 1.0, 4) == [] and axis(2.0, 1.0, 4) == [] and axis(0.0, float("inf"), 4) == []


def test_y_range_pads_and_widens_a_flat_line():
    assert y_range(0.0, 1.0) == pytest.approx((-0.06, 1.06))
    lo, hi = y_range(2.0, 2.0)
    assert lo < 2.0 < hi and hi - lo > 1.0


def test_chart_axes_are_the_full_view_with_ticks():
    ax = report.chart_axes([[6, 5.7518, 0, "rl"], [7, 5.7529, 1, "rl"], [26, 5.7523, 20, "rl"]])
    assert (ax["x0"], ax["x1"]) == (6, 26)
    assert ax["y0"] < 5.7518 and ax["y1"] > 5.7529
    labels = [label for _, label in ax["yticks"]]
    assert len(labels) >= 3 and len(set(labels)) == len(labels) and all(len(lab) == 6 for lab in labels)
    single = report.chart_axes([[3, 0.5, 2, None]])
    assert (single["x0"], single["x1"]) == (2.5, 3.5) and [t[1] for t in single["xticks"]] == ["3"]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed: the JavaScript copy is not run")
def test_the_pages_javascript_gives_the_same_ticks():
    assert TICKS_JS in PAGE_JS
    cases = CASES + _random_cases(300)
    script = (
        TICKS_JS
        + f"const cases = {json.dumps(cases)};"
        + "console.log(JSON.stringify({ticks: cases.map(c => axisTicks(c[0], c[1], c[2], c[3])),"
        + " ranges: cases.map(c => yRange(c[0], c[1])).concat([yRange(2, 2)])}));"
    )
    out = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout)
    for case, js in zip(cases, out["ticks"], strict=True):
        py = axis(*case)
        assert [label for _, label in js] == [label for _, label in py], case
        assert [v for v, _ in js] == pytest.approx([v for v, _ in py], rel=1e-15), case
    ranges = [list(y_range(lo, hi)) for lo, hi, _, _ in cases] + [list(y_range(2.0, 2.0))]
    assert out["ranges"] == ranges  # the same float operations in the same order
