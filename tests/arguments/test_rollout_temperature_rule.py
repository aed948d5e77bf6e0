"""slime refuses a training rollout temperature <= 0 (slime/utils/arguments.py slime_validate_args:
greedy decoding is not an RL policy); evaluation may still be greedy."""

import pytest

from slime.errors import SlimeError
from tests.helpers import make_args


@pytest.mark.parametrize("value", ["0", "0.0", "-0.5", "nan", "inf"])
def test_rollout_temperature_must_be_positive(value):
    with pytest.raises(
        SlimeError, match=r"--rollout-temperature must be > 0, got .*greedy decoding.*--eval-temperature 0"
    ):
        make_args(f"--rollout-temperature={value}")


def test_eval_temperature_0_stays_allowed():
    args = make_args("--rollout-temperature", "0.7", "--eval-temperature", "0")
    assert args.rollout_temperature == 0.7 and args.eval_temperature == 0.0
    assert make_args("--rollout-temperature", "1e-3").rollout_temperature == 1e-3
