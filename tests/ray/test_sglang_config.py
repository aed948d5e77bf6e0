"""--sglang-config: slime's YAML schema read, checked and resolved, and laid over the placement."""

from __future__ import annotations

import textwrap

import pytest

from slime.errors import SlimeError
from slime.ray.model_fleet import plan_models
from slime.ray.placement import Placement
from slime.ray.sglang_config import check_exclusions, load_sglang_config, override_tokens, parse_sglang_config
from tests.helpers import make_args

MULTI = """
sglang:
  - name: actor
    server_groups:
      - worker_type: regular
        num_gpus: 2
  - name: judge
    model_path: {judge}
    num_gpus_per_engine: 2
    server_groups:
      - worker_type: regular
        num_gpus: 2
        overrides: {{context_length: 128, disable_radix_cache: true, enable_x: false}}
  - name: spare
    update_weights: false
    engine_groups:
      - {{worker_type: placeholder, num_gpus: 1}}
      - {{worker_type: regular, num_gpus: 1}}
"""


def _write(tmp_path, text: str, name: str = "models.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _args(tmp_path, **options):
    options.setdefault("hf_checkpoint", str(tmp_path / "actor"))
    options.setdefault("rollout_num_gpus", 6)
    return make_args(**options)


def test_multi_model_file_resolves_slimes_defaults(tmp_path):
    args = _args(tmp_path)
    cfg = parse_sglang_config(_write(tmp_path, MULTI.format(judge=tmp_path / "judge")), args)
    actor, judge, spare = cfg.models
    assert [m.name for m in cfg.models] == ["actor", "judge", "spare"]
    assert actor.model_path == args.hf_checkpoint and actor.update_weights  # inferred: the trained checkpoint
    assert judge.model_path == str(tmp_path / "judge") and not judge.update_weights  # inferred: another one
    assert any("model 'judge'" in n and "frozen" in n for n in cfg.notes)
    assert judge.groups[0].num_gpus_per_engine == 2 and judge.num_engines == 1  # the model's default
    assert judge.groups[0].override_args() == ["--context-length", "128", "--disable-radix-cache"]
    assert spare.model_path == args.hf_checkpoint and not spare.update_weights  # explicit wins over inference
    assert [g.num_engines for g in spare.groups] == [0, 1]  # engine_groups: slime's older name
    assert cfg.policy is actor and cfg.frozen == [judge, spare]


def test_plan_lays_groups_over_the_placement_in_file_order(tmp_path):
    args = _args(tmp_path)
    cfg = parse_sglang_config(_write(tmp_path, MULTI.format(judge=tmp_path / "judge")), args)
    placement = Placement(
        pg=None, actor_bundles=[], engine_bundles=[10, 11, 12, 13, 14, 15], actor_cpus=1, engine_cpus=1
    )
    actor, judge, spare = plan_models(args, placement, cfg)
    assert [(s.rank, s.bundle) for s in actor.slots] == [(0, 10), (1, 11)]
    assert [(s.rank, s.bundle) for s in judge.slots] == [(2, 12)]  # 2 slots, one engine
    assert [(s.rank, s.bundle) for s in spare.slots] == [(3, 15)]  # after its placeholder slot
    launch = judge.slots[0].launch
    assert launch.frozen and launch.num_gpus == 2 and launch.model_path == str(tmp_path / "judge")
    assert launch.extra_args == ("--context-length", "128", "--disable-radix-cache")
    assert not actor.slots[0].launch.frozen and actor.updatable and not judge.updatable


def test_without_a_file_one_model_and_prefill_num_servers_splits_it(tmp_path):
    args = _args(tmp_path, rollout_num_gpus=4)
    (model,) = load_sglang_config(args).models
    assert model.name == "default" and model.update_weights and model.num_engines == 4
    cfg = load_sglang_config(_args(tmp_path, rollout_num_gpus=4, prefill_num_servers=1))
    assert [(g.worker_type, g.num_gpus) for g in cfg.models[0].groups] == [("prefill", 1), ("decode", 3)]
    assert cfg.notes and "no prefill/decode disaggregation" in cfg.notes[0]
    with pytest.raises(SlimeError, match="--prefill-num-servers 4: 4 of --rollout-num-gpus 4"):
        load_sglang_config(_args(tmp_path, rollout_num_gpus=4, prefill_num_servers=4))


def test_override_tokens_spell_server_arguments():
    assert override_tokens({"a_b": 1, "on": True, "off": False, "l": [1, 2], "d": {"k": 1}}) == [
        "--a-b",
        "1",
        "--on",
        "--l",
        "1",
        "2",
        "--d",
        '{"k": 1}',
    ]


BAD = [
    ("sglang: []", "sglang: must be a non-empty list"),
    ("models: []", "top level: needs a 'sglang' key"),
    ("sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 2}]}]\nextra: 1", "unknown keys ['extra']"),
    ("sglang: [{server_groups: []}]", "sglang[0].name: must be a non-empty string"),
    ("sglang: [{name: a}]", "model 'a' (sglang[0]) server_groups: is required"),
    (
        "sglang: [{name: a, server_group: []}]",
        "model 'a' (sglang[0]): unknown key 'server_group'; did you mean 'server_groups'",
    ),
    (
        "sglang: [{name: a, server_groups: [{worker_type: mixed, num_gpus: 2}]}]",
        "server_groups[0].worker_type: must be one of regular, prefill, decode, placeholder, got 'mixed'",
    ),
    ("sglang: [{name: a, server_groups: [{worker_type: encoder, num_gpus: 2}]}]", "'encoder' groups"),
    ("sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 0}]}]", "[0].num_gpus: must be a positive"),
    (
        "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 2, num_gpus_per_engine: 3}]}]",
        "num_gpus: 2 is not a multiple of num_gpus_per_engine 3",
    ),
    (
        "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 1}]}]",
        "add up to 1, but --rollout-num-gpus is 2",
    ),
    (
        "sglang: [{name: a, update_weights: 'yes', server_groups: [{worker_type: regular, num_gpus: 2}]}]",
        "model 'a' (sglang[0]) update_weights: must be true or false",
    ),
    (
        "sglang: [{name: a, update_weights: false, server_groups: [{worker_type: regular, num_gpus: 2}]}]",
        "no model receives the trained weights",
    ),
    (
        "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 1}]},"
        " {name: a, server_groups: [{worker_type: regular, num_gpus: 1}]}]",
        "model names must be unique; ['a']",
    ),
    (
        "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 1}]},"
        " {name: b, update_weights: true, server_groups: [{worker_type: regular, num_gpus: 1}]}]",
        "model 'b' update_weights: only one model receives the trained weights",
    ),
    (
        "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 1}, {worker_type: prefill, num_gpus: 1}]}]",
        "mixes regular groups with prefill/decode",
    ),
    (
        "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 2, overrides: {port: 1}}]}]",
        "server_groups[0].overrides.port: is set by the framework",
    ),
    (
        "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 1, overrides: {model_path: /x}},"
        " {worker_type: regular, num_gpus: 1}]}]",
        "server groups name different checkpoints",
    ),
    ("sglang: [{name: a, server_groups: [{worker_type: placeholder, num_gpus: 2}]}]", "only placeholder groups"),
    ("sglang: [oops", "not valid YAML"),
]


@pytest.mark.parametrize("text, needle", BAD)
def test_bad_files_name_the_file_model_and_key(tmp_path, text, needle):
    path = _write(tmp_path, text, "bad.yaml")
    with pytest.raises(SlimeError) as e:
        parse_sglang_config(path, _args(tmp_path, rollout_num_gpus=2))
    assert needle in str(e.value) and str(e.value).startswith(f"--sglang-config {path}")


def test_a_missing_file_and_a_second_updatable_model_by_inference(tmp_path):
    with pytest.raises(SlimeError, match="nope.yaml: cannot read it"):
        parse_sglang_config(str(tmp_path / "nope.yaml"), _args(tmp_path))
    text = "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 1}]}, {name: ref, server_groups: [{worker_type: regular, num_gpus: 1}]}]"
    cfg = parse_sglang_config(_write(tmp_path, text), _args(tmp_path, rollout_num_gpus=2))
    assert cfg.policy.name == "a" and not cfg.models[1].update_weights  # slime syncs only the first
    assert any("'ref' also serves --hf-checkpoint" in n for n in cfg.notes)


def test_group_engines_must_fit_the_placement_unit(tmp_path):
    text = "sglang: [{name: a, server_groups: [{worker_type: regular, num_gpus: 3, num_gpus_per_engine: 3}]}]"
    args = _args(tmp_path, rollout_num_gpus=4, rollout_num_gpus_per_engine=2)
    with pytest.raises(SlimeError, match="3 is not a multiple of --rollout-num-gpus-per-engine 2"):
        parse_sglang_config(_write(tmp_path, text), args)


def test_mutual_exclusions(tmp_path):
    with pytest.raises(SlimeError, match="mutually exclusive"):
        check_exclusions(_args(tmp_path, sglang_config="x.yaml", prefill_num_servers=1))
    with pytest.raises(SlimeError, match="--rollout-external-engine-addrs"):
        check_exclusions(_args(tmp_path, sglang_config="x.yaml", rollout_external_engine_addrs="127.0.0.1:1"))
    with pytest.raises(SlimeError, match="--sglang-router-ip names a router"):
        check_exclusions(_args(tmp_path, sglang_config="x.yaml", sglang_router_ip="127.0.0.1", sglang_router_port=1))
    check_exclusions(_args(tmp_path))


def test_preflight_checks_checkpoints_and_overrides(tmp_path, tiny_model_dir):
    from slime.ray.sglang_config import check_sglang_config

    def args_for(text: str):
        return _args(
            tmp_path, hf_checkpoint=str(tiny_model_dir), rollout_num_gpus=2, sglang_config=_write(tmp_path, text)
        )

    group = "{worker_type: regular, num_gpus: 1, overrides: %s}"
    two = "sglang: [{name: a, server_groups: [%s]}, {name: j, update_weights: false, model_path: %s, server_groups: [%s]}]"
    path = str(tiny_model_dir)
    notes = check_sglang_config(args_for(two % (group % "{}", path, group % "{context_length: 64}")))
    assert notes == []
    with pytest.raises(SlimeError, match=r"model 'j' model_path .*/nowhere: not a directory"):
        check_sglang_config(args_for(two % (group % "{}", tmp_path / "nowhere", group % "{}")))
    with pytest.raises(
        SlimeError, match=r"model 'j' server_groups\[0\].overrides: unknown engine argument --contxt-length"
    ):
        check_sglang_config(args_for(two % (group % "{}", path, group % "{contxt_length: 64}")))
    notes = check_sglang_config(args_for(two % (group % "{enable_torch_compile: true}", path, group % "{}")))
    assert len(notes) == 1 and "model 'a'" in notes[0] and "enable-torch-compile" in notes[0]
    assert check_sglang_config(_args(tmp_path)) == []  # no --sglang-config: nothing to say
