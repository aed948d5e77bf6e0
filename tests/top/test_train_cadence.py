"""Save and eval cadence of the training loop, slime's rule (slime/utils/misc.py
`should_run_periodic_action`, called by slime's train.py): every interval rollouts and at each
epoch's end, the last rollout saved (not evaluated) too, nothing without an interval; and
--num-rollout 0, slime's eval-only run. The real `slime.train._loop` runs against stand-ins for
the rollout manager and trainer that record what they are asked to do."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from slime import train as train_mod
from slime.utils.misc import should_run_periodic_action
from tests.helpers import make_args

# (interval, rollout_id, num_rollout_per_epoch, num_rollout) -> due, worked out by hand
TABLE = [
    (None, 0, None, None, False),
    (None, 9, None, 10, False),  # no interval: not even the last rollout
    (None, 3, 4, 10, False),  # nor an epoch end
    (1, 0, None, None, True),
    (2, 0, None, None, False),
    (2, 1, None, None, True),
    (2, 2, None, None, False),
    (3, 5, None, None, True),
    (3, 6, None, None, False),
    (5, 6, None, 7, True),  # the last rollout
    (5, 5, None, 7, False),
    (5, 4, None, 7, True),
    (100, 3, 4, None, True),  # epoch end: 4 rollouts an epoch
    (100, 7, 4, None, True),
    (100, 5, 4, None, False),
    (100, 8, 4, 9, True),  # the last rollout, not an epoch end
    (3, 2, 4, None, True),  # the interval, not an epoch end
]


@pytest.mark.parametrize("interval,rollout_id,per_epoch,num_rollout,due", TABLE)
def test_should_run_periodic_action(interval, rollout_id, per_epoch, num_rollout, due):
    assert should_run_periodic_action(rollout_id, interval, per_epoch, num_rollout) is due


class _Call:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *a, **kw):
        return self.fn(*a, **kw)

    def options(self, **kw):
        return self


class _Manager:
    """The rollout manager's calls the loop makes, each recorded; results are plain values."""

    def __init__(self, log):
        self.log = log
        self.generate = _Call(lambda i: (log.append(("generate", i)) or f"data{i}", {"rollout/raw_reward": 0.5}))
        self.eval = _Call(lambda i: log.append(("eval", i)) or {"eval/arith": float(i)})
        self.save = _Call(lambda i, ckpt: log.append(("save_data", i)))
        self.prepare_weight_update = _Call(lambda: (False, ["http://engine"], {}))
        self.after_weight_update = _Call(lambda: None)
        self.offload = self.onload = _Call(lambda: None)


class _Trainer:
    def __init__(self, log):
        self.log = log

    def train(self, rollout_id, ref):
        self.log.append(("train", rollout_id))
        return {"train/loss": 1.0}

    def save(self, rollout_id):
        self.log.append(("save", rollout_id))
        return "ckpt"

    def connect_rollout(self, urls):
        pass

    def update_weights(self, weight_version):
        self.log.append(("sync", weight_version))
        return {}


@pytest.fixture
def run_loop(monkeypatch):
    """Drive `_loop` (ray.get / ray.wait of plain values; checkpoint commits and reports recorded)."""
    monkeypatch.setattr(train_mod, "ray", SimpleNamespace(get=lambda x, timeout=None: x, wait=lambda r, **kw: (r, [])))

    def run(per_epoch=None, **options):
        log, steps = [], []
        args = make_args(**{k: v for k, v in options.items() if k in ("num_rollout", "lr_decay_style")})
        for key, value in options.items():  # eval data sets are the rollout manager's: stand-ins here
            setattr(args, key, value)
        args.start_rollout_id = options.get("start_rollout_id", 0)
        monkeypatch.setattr(train_mod, "commit_checkpoint", lambda save, i: log.append(("commit", i)))
        monkeypatch.setattr(train_mod, "report_run", lambda run_dir: None)
        metrics_log = SimpleNamespace(log=lambda step, metrics: steps.append(step))
        train_mod._loop(args, _Manager(log), _Trainer(log), metrics_log, 0, per_epoch)
        return log, steps

    return run


def _of(log, kind):
    return [i for k, i in log if k == kind]


def test_intervals_and_the_last_rollout(run_loop):
    log, steps = run_loop(num_rollout=5, save_interval=2, eval_interval=2)
    assert _of(log, "train") == [0, 1, 2, 3, 4]
    assert _of(log, "save") == _of(log, "commit") == _of(log, "save_data") == [1, 3, 4]  # 4: the last
    assert _of(log, "eval") == [-1, 1, 3]  # before training, then the interval's; the last is not forced
    assert steps == [0, 1, 2, 3, 4, 5]


def test_no_interval_no_save_and_no_eval(run_loop):
    log, steps = run_loop(num_rollout=3, save_interval=None, eval_interval=None)
    assert _of(log, "train") == [0, 1, 2] and not _of(log, "save") and not _of(log, "eval")
    assert steps == [1, 2, 3]


def test_epoch_ends_are_save_and_eval_points(run_loop):
    log, _ = run_loop(per_epoch=4, num_rollout=10, save_interval=3, eval_interval=6, skip_eval_before_train=True)
    assert _of(log, "save") == [2, 3, 5, 7, 8, 9]  # every 3rd, the epoch ends (3, 7) and the last (9)
    assert _of(log, "eval") == [3, 5, 7]


def test_resumed_runs_do_not_evaluate_before_training(run_loop):
    log, _ = run_loop(num_rollout=4, eval_interval=1, start_rollout_id=2)
    assert _of(log, "eval") == [2, 3] and _of(log, "train") == [2, 3]


@pytest.mark.parametrize("skip", [False, True])
def test_num_rollout_0_evaluates_once_and_trains_nothing(run_loop, skip):
    log, steps = run_loop(num_rollout=0, lr_decay_style="constant", eval_interval=5, skip_eval_before_train=skip)
    assert _of(log, "eval") == [-1] and steps == [0]
    # the trainer's weights are pushed to the engines first (what is evaluated is --load's policy)
    assert [k for k, _ in log] == ["sync", "eval"]


def test_num_rollout_0_without_an_eval_interval_does_nothing(run_loop):
    log, steps = run_loop(num_rollout=0, lr_decay_style="constant", eval_interval=None)
    assert [k for k, _ in log] == ["sync"] and steps == []


def test_rollouts_per_epoch_is_counted_for_num_epoch(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+0=", "label": str(i)}) + "\n" for i in range(10)))
    argv = ["--prompt-data", str(data), "--input-key", "prompt", "--label-key", "label"]
    args = make_args(*argv, "--rollout-batch-size", "3", "--save-interval", "50")
    assert train_mod._rollouts_per_epoch(args) == 3  # 10 prompts // 3 a rollout
    args.save_interval = None
    assert train_mod._rollouts_per_epoch(args) is None  # no interval: nothing to count


def test_num_rollout_0_is_accepted_and_negative_refused():
    assert make_args(num_rollout=0, lr_decay_style="constant").num_rollout == 0
    # under the default schedule too (warm-up and decay): no step is taken, slime builds no scheduler
    args = make_args(num_rollout=0, lr_warmup_iters=5)
    assert args.num_rollout == 0 and args.lr_decay_iters > args.lr_warmup_iters
    with pytest.raises(Exception, match=r"--num-rollout must be >= 0 \(0: evaluate only\), got -1"):
        make_args("--num-rollout=-1")
