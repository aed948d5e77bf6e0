"""--use-wandb with the real wandb package, offline (nothing here opens a network connection):
the run holds the keys, values and steps of metrics.jsonl and TensorBoard; slime's wandb and
TensorBoard options with slime's names, dests and defaults; how the mode is chosen."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch

from slime.arguments import build_parser, parse_args, startup_notes
from slime.errors import SlimeError
from slime.observability import wandb_sink
from slime.observability.metrics import MetricsLogger, read_metrics, tensorboard_dir
from slime.observability.wandb_sink import read_offline_history, resolve_mode

BASE = ["--rollout-batch-size", "2", "--num-rollout", "1"]
BOOKKEEPING = ("rollout_id", "global_step", "stage", "time")


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """wandb confined to tmp_path, no credentials anywhere, no WANDB_MODE unless a test sets it."""
    for var in (
        "WANDB_API_KEY",
        "WANDB_IDENTITY_TOKEN_FILE",
        "WANDB_MODE",
        "WANDB_BASE_URL",
        "WANDB_DIR",
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_RUN_ID",
        "WANDB_RESUME",
        "TENSORBOARD_DIR",
    ):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("NETRC", str(home / ".netrc"))  # no `wandb login` entry
    for var, sub in (
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
    ):
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's stdout capture alone
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")

    def no_network(*a, **k):
        raise AssertionError("a test tried to open a network connection")

    monkeypatch.setattr(wandb_sink, "host_reachable", no_network)
    return tmp_path


def _expected_rows(records):
    """{global_step: {key: value}} a sink must hold: each record's numeric values (nulls and strings
    are JSON-only), rows of the same global step merged, as metrics.jsonl readers see them."""
    rows: dict[int, dict] = {}
    for r in records:
        vals = {k: v for k, v in r.items() if k not in BOOKKEEPING and isinstance(v, (int, float))}
        if vals:
            rows.setdefault(r["global_step"], {}).update(vals)
    return rows


def _stage(run_dir, stage, extra, steps):
    args = parse_args(
        BASE
        + [
            "--run-dir",
            str(run_dir),
            "--stage",
            stage,
            "--use-wandb",
            "--use-tensorboard",
            "--wandb-project",
            "proj",
            "--wandb-group",
            "grp",
            *extra,
        ]
    )
    with MetricsLogger.from_args(args, console=False) as lg:
        assert lg._wandb is not None and lg._wandb.mode == "offline"
        assert "wandb_key" not in lg._wandb.run.config and lg._wandb.run.config["stage"] == stage
        for step, metrics in steps:
            lg.log(step, metrics)
    return args


def test_wandb_run_holds_the_keys_values_and_steps_of_metrics_jsonl_and_tensorboard(wandb_env, monkeypatch, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_env / "wbdir"))
    run_dir = wandb_env / "run"
    t0 = time.monotonic()
    # driven as slime.train's loop: eval before training at step 0, then rollout k's row at step k + 1
    sft = _stage(
        run_dir,
        "sft",
        ["--wandb-key", "not-a-real-key"],
        [
            (0, {"eval/arith": 0.125}),
            (1, {"train/sft_loss": torch.tensor(1.5), "perf/train_time": 0.25, "perf/step_time": 0.5}),
            (2, {"train/sft_loss": 0.75, "train/grad_norm": float("nan"), "perf/step_time": 0.5, "eval/arith": 0.5}),
        ],
    )
    rl = _stage(
        run_dir,
        "rl",
        [],
        [  # a second stage of the same run directory continues the run
            (
                1,
                {
                    "rollout/raw_reward": 0.25,
                    "train/pg_loss": -0.0125,
                    "rollout/response_len/mean": 7,
                    "note": "text is JSON-only",
                    "flag": True,
                },
            ),
            (2, {"rollout/raw_reward": 0.5, "train/pg_loss": float("inf"), "eval/arith": 0.75}),
        ],
    )
    elapsed = time.monotonic() - t0
    out = capsys.readouterr().out
    assert out.count("[slime] wandb: offline run ") == 2 and "upload it with `wandb sync`" in out

    saved = json.loads((run_dir / wandb_sink.RUN_FILE).read_text())
    assert sft.wandb_run_id == rl.wandb_run_id == saved["id"]  # one wandb run for both stages
    assert saved["group"].startswith("grp_") and saved["name"] == saved["group"] + "-RANK_0"  # slime's naming

    records = read_metrics(run_dir)
    assert [r["global_step"] for r in records] == [0, 1, 2, 4, 5]  # the rl stage continues after step 2
    expected = _expected_rows(records)
    assert expected[2]["eval/arith"] == 0.5 and "train/grad_norm" not in expected[2]
    assert expected[4]["flag"] == 1 and "note" not in expected[4] and "train/pg_loss" not in expected[5]

    history = read_offline_history(wandb_env / "wbdir", run_id=saved["id"], wait_s=10)
    assert [step for step, _ in history] == sorted(expected)
    assert dict(history) == expected

    acc = EventAccumulator(str(tensorboard_dir(rl)))
    acc.Reload()
    tb = {}
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            tb.setdefault(ev.step, {})[tag] = ev.value
    assert tb.keys() == expected.keys()
    for step, row in expected.items():
        assert tb[step] == pytest.approx(row), step
    print(f"two offline wandb stages (init, 5 rows, finish): {elapsed:.1f} s")
    assert elapsed < 30


def test_no_key_means_offline_said_in_one_line_without_touching_the_network(wandb_env, capsys):
    args = parse_args(
        BASE
        + [
            "--run-dir",
            str(wandb_env / "run"),
            "--use-wandb",
            "--disable-wandb-random-suffix",
            "--wandb-group",
            "exp1",
            "--wandb-dir",
            str(wandb_env / "wb"),
        ]
    )
    with MetricsLogger.from_args(args, console=False) as lg:
        assert lg._wandb.mode == "offline"
        assert lg._wandb.run.group == "exp1" and lg._wandb.run.name == "exp1"
        lg.log(0, {"rollout/raw_reward": 1.0})
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "wandb" in ln]
    assert len(lines) == 1 and "offline" in lines[0] and "no API key" in lines[0], lines
    assert str((wandb_env / "wb" / "wandb").resolve()) in lines[0]
    assert read_offline_history(wandb_env / "wb", wait_s=10) == [(0, {"rollout/raw_reward": 1.0})]


def test_resolve_mode(monkeypatch):
    def creds(yes):
        return lambda key, host: yes

    def reach(yes):
        return lambda host: yes

    def never(*a):
        raise AssertionError("must not be called")

    env: dict[str, str] = {}
    h = "https://wandb.example"
    assert resolve_mode("offline", None, h, env=env, have_credentials=never, reachable=never) == ("offline", None)
    assert resolve_mode("disabled", None, h, env=env, have_credentials=never, reachable=never) == ("disabled", None)
    assert resolve_mode(None, None, h, env={"WANDB_MODE": "offline"}, have_credentials=never, reachable=never) == (
        "offline",
        None,
    )
    assert resolve_mode(None, None, h, env={"WANDB_MODE": "dryrun"}, have_credentials=never, reachable=never) == (
        "offline",
        None,
    )
    # not asked: no key -> offline without probing; key but no answer -> offline; both -> online
    mode, why = resolve_mode(None, None, h, env=env, have_credentials=creds(False), reachable=never)
    assert mode == "offline" and "no API key" in why
    mode, why = resolve_mode(None, "k", h, env=env, have_credentials=creds(True), reachable=reach(False))
    assert mode == "offline" and why == f"{h} is not reachable"
    assert resolve_mode(None, "k", h, env=env, have_credentials=creds(True), reachable=reach(True)) == ("online", None)
    # online asked for explicitly and impossible: stop, naming what is missing
    with pytest.raises(SlimeError, match="--wandb-mode online: no wandb API key"):
        resolve_mode("online", None, h, env=env, have_credentials=creds(False), reachable=never)
    with pytest.raises(SlimeError, match="--wandb-mode online: the wandb host https://wandb.example is not reachable"):
        resolve_mode("online", "k", h, env=env, have_credentials=creds(True), reachable=reach(False))
    with pytest.raises(SlimeError, match="WANDB_MODE online"):
        resolve_mode(None, "k", h, env={"WANDB_MODE": "online"}, have_credentials=creds(True), reachable=reach(False))
    # the command line wins over the environment
    assert resolve_mode("offline", None, h, env={"WANDB_MODE": "online"}, have_credentials=never, reachable=never) == (
        "offline",
        None,
    )


def test_explicit_online_without_network_stops_before_the_run(wandb_env, monkeypatch):
    monkeypatch.setattr(wandb_sink, "host_reachable", lambda url, timeout=2.0: False)
    args = parse_args(
        BASE
        + [
            "--run-dir",
            str(wandb_env / "run"),
            "--use-wandb",
            "--wandb-mode",
            "online",
            "--wandb-key",
            "x" * 40,
            "--wandb-host",
            "http://127.0.0.1:9",
        ]
    )
    with pytest.raises(SlimeError, match="is not reachable"):
        MetricsLogger.from_args(args, console=False)
    assert not (wandb_env / "run" / "wandb").exists()


def test_host_probe_is_bounded(monkeypatch):
    with socket.socket() as srv:  # a listening local port answers; a closed one does not
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert wandb_sink.host_reachable(f"http://127.0.0.1:{port}", timeout=2)
    assert not wandb_sink.host_reachable(f"http://127.0.0.1:{port}", timeout=2)

    def hang(*a, **k):  # a resolver or connect that takes far longer than the probe may
        time.sleep(3)
        raise OSError("timed out")

    monkeypatch.setattr(socket, "create_connection", hang)
    t0 = time.monotonic()
    assert not wandb_sink.host_reachable("https://api.wandb.ai", timeout=0.3)
    assert time.monotonic() - t0 < 1.5


# slime's add_wandb_arguments and add_tensorboard_arguments (slime/utils/arguments.py, THUDM/slime at
# 624b824a898ab0ec1fcb4d373004c7f3852bf515): option -> (dest, default, kind). `--wandb-project` is
# Megatron's, its default reset to None by slime's reset_arg.
SLIME_LOGGING_OPTIONS = {
    "--use-wandb": ("use_wandb", False, "store_true"),
    "--wandb-mode": ("wandb_mode", None, ("online", "offline", "disabled")),
    "--wandb-dir": ("wandb_dir", None, str),
    "--wandb-key": ("wandb_key", None, str),
    "--wandb-host": ("wandb_host", None, str),
    "--wandb-team": ("wandb_team", None, str),
    "--wandb-group": ("wandb_group", None, str),
    "--wandb-project": ("wandb_project", None, str),
    "--disable-wandb-random-suffix": ("wandb_random_suffix", True, "store_false"),
    "--wandb-always-use-train-step": ("wandb_always_use_train_step", False, "store_true"),
    "--log-multi-turn": ("log_multi_turn", False, "store_true"),
    "--log-passrate": ("log_passrate", False, "store_true"),
    "--log-reward-category": ("log_reward_category", None, str),
    "--log-correct-samples": ("log_correct_samples", False, "store_true"),
    "--wandb-run-id": ("wandb_run_id", None, str),
    "--use-tensorboard": ("use_tensorboard", False, "store_true"),
    "--tb-project-name": ("tb_project_name", None, str),
    "--tb-experiment-name": ("tb_experiment_name", None, str),
}


def test_logging_options_have_slimes_names_dests_and_defaults():
    parser = build_parser()
    actions = {s: a for a in parser._actions for s in a.option_strings}
    logging_group = next(g for g in parser._action_groups if g.title == "logging")
    args = parse_args(BASE)
    for name, (dest, default, kind) in SLIME_LOGGING_OPTIONS.items():
        a = actions[name]
        assert a in logging_group._group_actions, f"{name} is not slime-rl's own (logging group)"
        assert (a.dest, a.default, getattr(args, dest)) == (dest, default, default), name
        if kind == "store_true":
            assert a.const is True and a.nargs == 0, name
        elif kind == "store_false":
            assert a.const is False and a.nargs == 0, name
        elif isinstance(kind, tuple):
            assert tuple(a.choices) == kind and a.type is str, name
        else:
            assert a.type is kind and a.choices is None, name
    flags = parse_args(BASE + ["--disable-wandb-random-suffix", "--wandb-mode", "offline", "--log-passrate"])
    assert flags.wandb_random_suffix is False and flags.wandb_mode == "offline" and flags.log_passrate is True
    with pytest.raises(SlimeError, match="invalid choice"):
        parse_args(BASE + ["--wandb-mode", "shared"])


def test_options_not_used_here_are_named_once_at_start_up(tmp_path, capsys):
    from slime.arguments.logs import unused_note

    assert unused_note(parse_args(BASE)) is None
    args = parse_args(
        BASE
        + [
            "--run-dir",
            str(tmp_path),
            "--wandb-always-use-train-step",
            "--wandb-project",
            "p",
            "--tb-project-name",
            "t",
        ]
    )
    note = unused_note(args)
    for opt in (
        "--wandb-always-use-train-step",
        "--wandb-project (without --use-wandb)",
        "--tb-project-name (without --use-tensorboard)",
    ):
        assert note.count(opt) == 1, opt
    notes = startup_notes(args)  # what train() prints once at start-up
    assert sum(n.startswith("logging options accepted but not used") for n in notes) == 1


def test_tensorboard_directory_follows_slimes_options(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    run = str(tmp_path / "run")
    assert tensorboard_dir(parse_args(BASE + ["--run-dir", run, "--use-tensorboard"])) == Path(run) / "tensorboard"
    named = parse_args(
        BASE + ["--run-dir", run, "--use-tensorboard", "--tb-project-name", "p", "--tb-experiment-name", "e"]
    )
    assert tensorboard_dir(named) == Path("tensorboard_log/p/e")
    stamped = parse_args(BASE + ["--run-dir", run, "--use-tensorboard", "--tb-project-name", "p"])
    assert len(stamped.tb_experiment_name) == 15 and stamped.tb_experiment_name[8] == "_"  # slime's %Y%m%d_%H%M%S
    assert tensorboard_dir(stamped) == Path("tensorboard_log/p") / stamped.tb_experiment_name
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    assert tensorboard_dir(named) == tmp_path / "tb"
    monkeypatch.chdir(tmp_path)
    with MetricsLogger.from_args(named, console=False) as lg:
        lg.log(0, {"rollout/raw_reward": 0.5})
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
