"""slime-rl's GRPO advantages and policy losses against TRL's own code on one identical batch
(what bench/vs_trl.py --check runs).

TRL runs in its own virtual environment (.venv-trl, created by `bench/vs_trl.py --install-only`);
the comparison is skipped, with the command to create it, only when that environment is absent.
Independent reference: TRL 1.16's `GRPOTrainer._generate_and_score_completions` (advantages) and
`GRPOTrainer._compute_loss` (loss), run unmodified in the TRL venv on the same model weights,
completions, old log-probs and rewards.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_vs_trl", ROOT / "bench" / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check_rows(tmp_path_factory):
    bench = _bench()
    if not bench.TRL_PYTHON.exists():
        pytest.skip(
            f"TRL's venv {bench.TRL_VENV} is absent; create it with "
            f"`.venv/bin/python bench/vs_trl.py --install-only` or: {bench.INSTALL_HOWTO}"
        )
    return bench.consistency_check(tmp_path_factory.mktemp("vs_trl"), install=False)


@pytest.mark.e2e
def test_loss_and_advantages_agree_with_trl(check_rows):
    cases = {r["case"].split(",")[0] for r in check_rows}
    assert {"grpo", "dapo", "bnpo", "gspo", "cispo"} <= cases
    for r in check_rows:
        assert r["loss_diff"] <= 1e-5, r
        assert r["adv_diff"] <= 1e-5, r
        assert r["ok"], r
        assert abs(r["trl_loss"]) > 1e-4, f"a vacuous comparison (loss ~ 0): {r}"
        assert r["clipfrac"] > 0, f"the batch must exercise the clipping: {r}"


@pytest.mark.e2e
def test_the_check_sees_the_epsilon_difference(check_rows):
    """TRL divides by std + 1e-4, slime by std + 1e-6: the check must be sharp enough to see it."""
    std_rows = [r for r in check_rows if r["std_normalised"]]
    assert std_rows
    for r in std_rows:
        assert r["adv_diff_slime_eps"] > 1e-5, r


def test_missing_trl_says_what_and_how(tmp_path):
    bench = _bench()
    bench.TRL_PYTHON = tmp_path / "no-venv" / "bin" / "python"
    bench.TRL_VENV = tmp_path / "no-venv"
    with pytest.raises(SystemExit) as e:
        bench.require_trl(install=False)
    msg = str(e.value)
    assert "TRL is not usable" in msg and "does not exist" in msg
    assert "pip install -c constraints.txt trl==1.16.0" in msg and "Traceback" not in msg


def test_python_without_trl_is_named(tmp_path):
    """A venv whose Python lacks TRL (here: this project's own) is reported as a missing module."""
    bench = _bench()
    bench.TRL_PYTHON = Path(sys.executable)
    status = bench.trl_status()
    assert status["ok"] is False and "trl" in status["missing"], status


def test_cli_without_trl_prints_no_traceback(tmp_path):
    """`--no-install` with no TRL venv: one message and the install command, exit status != 0."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "vs_trl.py"),
            "--check",
            "--no-install",
            "--trl-venv",
            str(tmp_path / "absent"),
            "--work-dir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "TRL is not usable" in proc.stderr and "trl==1.16.0" in proc.stderr, proc.stderr[-2000:]
