"""slime's --start-rollout-id, --disable-rollout-global-dataset, --custom-config-path and --loss-mask-type:
parsing (slime's names, dests and defaults), the data source without a global dataset, which data state a
run resumes from, the trainer's LR position, the custom config's attributes, and the SFT loss mask each
--loss-mask-type gives (against masks built here by hand from what the tiny model's template emits)."""

import copy
import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from slime.arguments import build_parser, parse_args
from slime.arguments.training import custom_config_note
from slime.arguments.upstream import NOT_SUPPORTED
from slime.data.data_source import DataSource, RolloutDataSource, RolloutDataSourceWithBuffer, resume, resume_rollout_id
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import ROLLOUT_STATE_FILE, TRACKER, iter_dir
from slime.utils.types import Sample
from tests.helpers import make_args

CUSTOM_ROLLOUT = "tests.contracts.hooks.rollout_function"  # any dotted path: parsing does not import it


# ---------------------------------------------------------------- parsing: slime's names, dests, defaults

# Facts read from slime's slime/utils/arguments.py (THUDM/slime 624b824): option -> (dest, default, action).
SLIME_FACTS = {
    "--start-rollout-id": ("start_rollout_id", None, "store"),  # type=int
    "--disable-rollout-global-dataset": ("rollout_global_dataset", True, "store_false"),
    "--custom-config-path": ("custom_config_path", None, "store"),  # type=str (reset_arg in add_slime_arguments)
    "--loss-mask-type": ("loss_mask_type", "qwen", "store"),  # choices qwen, qwen3, qwen3_5, distill_qwen
}


def test_options_have_slimes_dest_default_and_action():
    parser = build_parser()
    actions = {s: a for a in parser._actions for s in a.option_strings}
    args = make_args()
    for option, (dest, default, kind) in SLIME_FACTS.items():
        action = actions[option]
        assert option not in parser.slime_names, f"{option} is defined by slime-rl, not added from data"
        assert option not in NOT_SUPPORTED
        assert action.dest == dest and getattr(args, dest) == default, option
        assert type(action).__name__ == {"store": "_StoreAction", "store_false": "_StoreFalseAction"}[kind]
    assert actions["--start-rollout-id"].type is int
    assert list(actions["--loss-mask-type"].choices) == ["qwen", "qwen3", "qwen3_5", "distill_qwen"]


def test_options_parse_to_their_values():
    args = make_args(
        "--start-rollout-id",
        "3",
        "--disable-rollout-global-dataset",
        "--loss-mask-type",
        "qwen3_5",
        num_rollout=5,
        rollout_function_path=CUSTOM_ROLLOUT,
    )
    assert (args.start_rollout_id, args.rollout_global_dataset, args.loss_mask_type) == (3, False, "qwen3_5")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--loss-mask-type", "llama"], "invalid choice"),
        (["--start-rollout-id", "-1"], "--start-rollout-id must be >= 0"),
        (["--start-rollout-id", "2", "--num-rollout", "2"], "leaves nothing to train"),
        (["--disable-rollout-global-dataset"], "sglang_rollout.generate_rollout takes its prompts from --prompt-data"),
        (
            [
                "--disable-rollout-global-dataset",
                "--rollout-function-path",
                "slime.rollout.sft_rollout.generate_rollout",
            ],
            "sft_rollout.generate_rollout takes its prompts",
        ),
        (
            [
                "--disable-rollout-global-dataset",
                "--rollout-function-path",
                CUSTOM_ROLLOUT,
                "--num-rollout",
                None,
                "--num-epoch",
                "2",
            ],
            "--num-epoch counts passes",
        ),
    ],
)
def test_bad_values_stop_at_parsing(argv, message):
    base = ["--rollout-batch-size", "1", "--num-rollout", "1"]
    if None in argv:  # drop --num-rollout
        i = argv.index(None)
        argv = argv[: i - 1] + argv[i + 1 :]
        base = ["--rollout-batch-size", "1"]
    with pytest.raises(SlimeError, match=message):
        parse_args(base + argv)


def test_start_rollout_id_is_checked_once_num_epoch_counts_the_rollouts():
    from slime.arguments import set_num_rollout

    args = parse_args(["--rollout-batch-size", "2", "--num-epoch", "1", "--start-rollout-id", "3"])
    with pytest.raises(SlimeError, match="leaves nothing to train: --num-rollout is 3"):
        set_num_rollout(args, 6)  # 1 epoch x 6 prompts // 2 = 3 rollouts: ids 0..2


# ---------------------------------------------------------------- --custom-config-path


def _config(tmp_path, text):
    p = tmp_path / "custom.yaml"
    p.write_text(text)
    return str(p)


def test_custom_config_keys_become_attributes_and_replace_arguments(tmp_path):
    path = _config(tmp_path, "my_threshold: 0.25\nmy_names: [a, b]\nmy-dashed: 1\nlr: 2.0e-5\nrollout_batch_size: 8\n")
    args = make_args("--custom-config-path", path, rollout_batch_size=2, lr=1e-6)
    assert args.my_threshold == 0.25 and args.my_names == ["a", "b"]
    assert getattr(args, "my-dashed") == 1  # set as written, as slime's setattr does
    # an existing argument is replaced (slime's rule), after the checks: what was derived from it stays
    assert args.lr == 2e-5 and args.rollout_batch_size == 8
    assert args.global_batch_size == 2  # derived from --rollout-batch-size 2 before the config applied
    assert args.custom_config_overrides == {"lr": 1e-6, "rollout_batch_size": 2}
    note = custom_config_note(args)
    assert "lr: 1e-06 -> 2e-05" in note and "rollout_batch_size: 2 -> 8" in note and path in note
    assert custom_config_note(make_args()) is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("lr: 1e-5\n", r"'lr' replaces args.lr \(1e-06, a float\) with '1e-5', a str \(YAML reads"),
        ("rollout_batch_size: 2.5\n", "replaces args.rollout_batch_size"),
        ("colocate: 1\n", "replaces args.colocate"),
        ("rollout-batch-size: 4\n", "would not replace args.rollout_batch_size; write 'rollout_batch_size'"),
        ("- a\n- b\n", "expected a mapping"),
        ("a: [\n", "invalid YAML"),
    ],
)
def test_custom_config_errors_name_the_file_and_key(tmp_path, text, message):
    path = _config(tmp_path, text)
    with pytest.raises(SlimeError, match=message) as e:
        make_args("--custom-config-path", path, lr=1e-6)
    assert "--custom-config-path" in str(e.value)


def test_custom_config_missing_file_and_empty_file(tmp_path):
    with pytest.raises(SlimeError, match="--custom-config-path: file not found"):
        make_args("--custom-config-path", str(tmp_path / "nope.yaml"))
    args = make_args("--custom-config-path", _config(tmp_path, ""))
    assert args.custom_config_overrides == {}


# ---------------------------------------------------------------- --disable-rollout-global-dataset


@pytest.fixture()
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(5)))
    return p


def test_without_global_dataset_get_samples_hands_out_buffer_then_empty_samples(prompts, tmp_path):
    args = make_args(
        "--disable-rollout-global-dataset",
        prompt_data=str(prompts),
        input_key="prompt",
        n_samples_per_prompt=2,
        rollout_function_path=CUSTOM_ROLLOUT,
        save=str(tmp_path / "ck"),
    )
    ds = RolloutDataSourceWithBuffer(args)
    assert len(ds) == 0 and ds.dataset is None  # --prompt-data not loaded (slime's)
    kept = [Sample(prompt="mine", index=100, group_index=50), Sample(prompt="mine", index=101, group_index=50)]
    ds.add_samples([kept])
    groups = ds.get_samples(3)
    assert groups[0] == kept  # the Data Buffer first
    fresh = [s for g in groups[1:] for s in g]
    assert [len(g) for g in groups] == [2, 2, 2]
    assert [(s.group_index, s.index) for s in fresh] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    for s in fresh:  # slime's Sample(): nothing but the numbering
        assert s == Sample(group_index=s.group_index, index=s.index)
    assert fresh[0] is not fresh[1]
    # no data position is saved or resumed
    assert ds.save(0) is None and not (tmp_path / "ck").exists()
    ds.load(tmp_path / "nowhere.json")  # no error: nothing to load


def test_with_global_dataset_and_no_prompt_data_says_what_to_set():
    ds = RolloutDataSource(make_args())
    with pytest.raises(SlimeError, match="--disable-rollout-global-dataset"):
        ds.get_samples(1)


def test_preflight_data_check_honours_the_flag(tmp_path):
    from slime.preflight import check_data

    with pytest.raises(SlimeError, match="--prompt-data is required"):
        check_data(make_args())
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(SlimeError, match="line 1"):
        check_data(make_args(prompt_data=str(bad), input_key="prompt"))
    # the rollout function manages its own data: --prompt-data is neither required nor read
    args = make_args("--disable-rollout-global-dataset", rollout_function_path=CUSTOM_ROLLOUT)
    assert check_data(args) is None
    args = make_args("--disable-rollout-global-dataset", rollout_function_path=CUSTOM_ROLLOUT, prompt_data=str(bad))
    assert check_data(args) is None


# ---------------------------------------------------------------- which data state a run resumes from


@pytest.fixture()
def checkpoints(prompts, tmp_path):
    """Data states saved at rollouts 1 (2 prompts handed out) and 3 (5 handed out); the latest is 3."""
    ck = tmp_path / "ck"
    args = make_args(prompt_data=str(prompts), input_key="prompt", save=str(ck), num_rollout=10)
    ds = RolloutDataSourceWithBuffer(args)
    ds.get_samples(2)
    ds.save(1)
    ds.get_samples(3)
    ds.save(3)
    (ck / TRACKER).write_text("3\n")
    return ck


def _fresh(prompts, ck, *argv):
    args = make_args(*argv, prompt_data=str(prompts), input_key="prompt", load=str(ck), num_rollout=10)
    return args, RolloutDataSourceWithBuffer(args)


@pytest.mark.parametrize(
    "argv, want_id, want_offset",
    [
        ([], 3, 5),  # unset: the latest checkpoint's (the trainer resumes at 4)
        (["--start-rollout-id", "4"], 3, 5),
        (["--start-rollout-id", "2"], 1, 2),  # slime: the state saved with start_rollout_id - 1
        (["--start-rollout-id", "3"], 2, 0),  # no state saved with rollout 2: from the beginning, as slime
        (["--start-rollout-id", "0"], None, 0),
    ],
)
def test_resume_follows_slimes_rule(prompts, checkpoints, argv, want_id, want_offset):
    args, ds = _fresh(prompts, checkpoints, *argv)
    assert resume_rollout_id(args) == want_id
    loaded = resume(ds, args)
    assert ds.offset == want_offset and ds.group_counter == want_offset
    if want_offset:
        assert loaded == iter_dir(checkpoints, want_id) / ROLLOUT_STATE_FILE
    else:
        assert loaded is None


def test_resume_does_nothing_without_load_or_global_dataset(prompts, checkpoints):
    args = make_args(prompt_data=str(prompts), input_key="prompt")
    assert resume_rollout_id(args) is None and resume(RolloutDataSource(args), args) is None
    args = make_args("--disable-rollout-global-dataset", rollout_function_path=CUSTOM_ROLLOUT, load=str(checkpoints))
    assert resume_rollout_id(args) is None and resume(RolloutDataSource(args), args) is None


class _Recorder(DataSource):
    def __init__(self):
        self.loads = []

    def get_samples(self, n):
        return []

    def add_samples(self, samples):
        pass

    def save(self, rollout_id):
        pass

    def load(self, rollout_id=None):
        self.loads.append(rollout_id)

    def __len__(self):
        return 0


@pytest.mark.parametrize(
    "argv, calls", [([], [3]), (["--start-rollout-id", "2"], [1]), (["--start-rollout-id", "0"], [])]
)
def test_resume_gives_a_custom_source_slimes_rollout_id(checkpoints, argv, calls):
    args = make_args(*argv, load=str(checkpoints), num_rollout=10)
    source = _Recorder()
    resume(source, args)
    assert source.loads == calls


# ---------------------------------------------------------------- the LR schedule does not jump to the start id


def test_lr_schedule_counts_steps_taken_not_the_start_rollout_id(tiny_model_dir, tmp_path):
    """slime (Megatron): the scheduler's position is its own step count (restored from a checkpoint),
    never derived from --start-rollout-id. Linear decay from lr to 0 over the run's 5 steps: step k has
    lr * (1 - k / 5)."""
    from slime.backends.torch.actor import TrainActor

    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "5",
            "--start-rollout-id",
            "3",
            "--lr",
            "1e-2",
            "--min-lr",
            "0",
            "--lr-decay-style",
            "linear",
            "--micro-batch-size",
            "4",
            "--run-dir",
            str(tmp_path),
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    assert actor.init() == 0  # no --load: the trainer has nothing to resume
    data = {
        "tokens": [[5, 6, 7, 8], [5, 6, 9, 10], [11, 12, 13], [11, 12, 14]],
        "response_lengths": [2, 2, 1, 1],
        "loss_masks": [[1, 1], [1, 1], [1], [1]],
        "rewards": [1.0, -1.0, 0.5, -0.5],
    }
    lrs = [actor.train(rollout_id, copy.deepcopy(data))["train/lr"] for rollout_id in (3, 4)]
    assert lrs == pytest.approx([1e-2, 1e-2 * (1 - 1 / 5)], rel=1e-9)


# ---------------------------------------------------------------- --loss-mask-type in the SFT rollout

from tests.rollout.test_sft_rollout import CONVERSATION  # noqa: E402 (one multi-turn conversation for both)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _by_hand(tok, pieces):
    """tokens and loss mask of (text, trained) pieces; then slime's cut: the response starts at the first 1."""
    tokens, mask = [], []
    for text, m in pieces:
        ids = tok.encode(text, add_special_tokens=False)
        tokens += ids
        mask += [m] * len(ids)
    first = mask.index(1)
    return tokens, mask[first:], len(tokens) - first


# The tiny template renders `<|ROLE|>CONTENT<|end|>` per message, `<|assistant|>` as the generation prompt.
PER_MESSAGE = [
    ("<|system|>Add.<|end|>", 0),
    ("<|user|>1+2=<|end|>", 0),
    ("<|assistant|>", 0),
    ("\\boxed{3}<|end|>", 1),
    ("<|user|>and 20+2?<|end|>", 0),
    ("<|tool|>calc: 22<|end|>", 0),
    ("<|assistant|>", 0),
    ("The answer is \\boxed{22}<|end|>", 1),
]
EXPECTED = {
    "qwen": PER_MESSAGE,  # each message rendered alone
    "qwen3": PER_MESSAGE,  # each message rendered beside a probe: the same on this template
    # the first message with the generation prompt, then the last message's content alone, all trained
    "distill_qwen": [("<|system|>Add.<|end|><|assistant|>", 0), ("The answer is \\boxed{22}", 1)],
}


def _sft_args(tmp_path, rows, tiny_model_dir, *argv):
    p = tmp_path / "sft.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return make_args(
        *argv, prompt_data=str(p), input_key="messages", hf_checkpoint=str(tiny_model_dir), rollout_batch_size=len(rows)
    )


@pytest.mark.parametrize("loss_mask_type", sorted(EXPECTED))
def test_sft_rollout_uses_the_loss_mask_type(tmp_path, tiny_model_dir, tok, loss_mask_type):
    from slime.rollout.sft_rollout import generate_rollout

    args = _sft_args(tmp_path, [{"messages": CONVERSATION}], tiny_model_dir, "--loss-mask-type", loss_mask_type)
    ((sample,),) = generate_rollout(args, 0, RolloutDataSource(args, tokenizer=tok))
    tokens, mask, response_length = _by_hand(tok, EXPECTED[loss_mask_type])
    assert sample.tokens == tokens
    assert sample.loss_mask == mask and sample.response_length == response_length == len(mask)
    assert sample.status == Sample.Status.COMPLETED and sample.reward == 0.0
    assert sample.response == tok.decode(tokens[-response_length:])


def test_sft_rollout_step_loss_mask_and_nothing_to_train(tmp_path, tiny_model_dir, tok):
    from slime.rollout.sft_rollout import generate_rollout

    quiet = copy.deepcopy(CONVERSATION)
    quiet[2]["step_loss_mask"] = 0  # slime: this assistant turn is not trained on
    args = _sft_args(tmp_path, [{"messages": quiet}], tiny_model_dir)
    ((sample,),) = generate_rollout(args, 0, RolloutDataSource(args, tokenizer=tok))
    pieces = [(text, 0 if text == "\\boxed{3}<|end|>" else m) for text, m in PER_MESSAGE]
    assert (sample.tokens, sample.loss_mask, sample.response_length) == _by_hand(tok, pieces)

    args = _sft_args(tmp_path, [{"messages": CONVERSATION[:2]}], tiny_model_dir)
    with pytest.raises(SlimeError, match=r"SFT sample 0: nothing to train on .*roles: \['system', 'user'\]"):
        generate_rollout(args, 0, RolloutDataSource(args, tokenizer=tok))


def test_sft_rollout_passes_the_rows_tools_to_the_template(tmp_path, tiny_model_dir, tok):
    from slime.data.tiny_model import CHAT_TEMPLATE
    from slime.rollout.sft_rollout import generate_rollout

    with_tools = copy.deepcopy(tok)
    with_tools.chat_template = (
        "{%- if tools -%}<|system|>tools={{ tools | length }}<|end|>{%- endif -%}" + CHAT_TEMPLATE
    )
    messages = [{"role": "user", "content": "57+8="}, {"role": "assistant", "content": "\\boxed{65}"}]
    tools = [{"name": "calc"}, {"name": "search"}]
    args = _sft_args(tmp_path, [{"messages": messages, "tools": tools}], tiny_model_dir)
    ((sample,),) = generate_rollout(args, 0, RolloutDataSource(args, tokenizer=with_tools))
    # slime: the tools go with the first message
    want = _by_hand(
        tok, [("<|system|>tools=2<|end|><|user|>57+8=<|end|>", 0), ("<|assistant|>", 0), ("\\boxed{65}<|end|>", 1)]
    )
    assert (sample.tokens, sample.loss_mask, sample.response_length) == want


def test_sft_rollout_errors_name_the_option(tmp_path, tiny_model_dir, tok):
    from slime.rollout.sft_rollout import generate_rollout

    # qwen3_5 looks for ChatML's `<|im_start|>assistant`, which the tiny template does not emit
    args = _sft_args(tmp_path, [{"messages": CONVERSATION}], tiny_model_dir, "--loss-mask-type", "qwen3_5")
    with pytest.raises(SlimeError, match="SFT sample 0: --loss-mask-type qwen3_5 failed"):
        generate_rollout(args, 0, RolloutDataSource(args, tokenizer=tok))
    args.rollout_global_dataset = False  # as a custom caller might hand it
    with pytest.raises(SlimeError, match="--disable-rollout-global-dataset"):
        generate_rollout(args, 0, RolloutDataSource(args, tokenizer=tok))


# ---------------------------------------------------------------- one short real run


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_short_sft_run_starts_at_the_start_rollout_id(ray_cluster, tiny_model_dir, task_dir, tmp_path, capsys):
    """--start-rollout-id 1 of 2 without --load: one rollout (id 1), data from its beginning, the LR at
    the schedule's first step, the custom config's lr in the trainer and named at start-up."""
    from slime.train import train

    run_dir = tmp_path / "run"
    config = _config(tmp_path, "lr: 2.0e-3\nmy_setting: 7\n")
    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(task_dir / "sft.jsonl"),
            "--input-key",
            "messages",
            "--loss-type",
            "sft_loss",
            "--rollout-max-response-len",
            "64",
            "--rollout-function-path",
            "slime.rollout.sft_rollout.generate_rollout",
            "--loss-mask-type",
            "qwen3",
            "--num-rollout",
            "2",
            "--start-rollout-id",
            "1",
            "--rollout-batch-size",
            "4",
            "--global-batch-size",
            "4",
            "--micro-batch-size",
            "4",
            "--lr",
            "1e-3",
            "--lr-decay-style",
            "linear",
            "--save-interval",
            "1",
            "--custom-config-path",
            config,
            "--colocate",
            "--run-dir",
            str(run_dir),
        ]
    )
    train(args)
    assert "replaced arguments (slime's rule): lr: 0.001 -> 0.002" in capsys.readouterr().out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [2]  # rollout 1 only, logged after its step
    assert rows[0]["train/lr"] == pytest.approx(2e-3)  # step 0 of the schedule, with the config's lr
    ckpts = run_dir / "checkpoints"
    assert not iter_dir(ckpts, 0).exists()
    state = json.loads((iter_dir(ckpts, 1) / ROLLOUT_STATE_FILE).read_text())
    assert (state["offset"], state["group_counter"]) == (4, 4)  # the data started at its first prompt
