import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from slime.data import arithmetic
from slime.data.arithmetic import num_problems, write_arithmetic_dataset
from slime.data.data_source import RolloutDataSource
from slime.data.dataset import PromptSamples, load_jsonl, load_prompt_samples
from slime.data.tiny_model import build_tiny_model
from slime.errors import SlimeError
from slime.utils.types import Sample
from tests.helpers import make_args


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.getbasetemp() / "tiny-qwen2"  # shared with test_tiny_model
    if not (d / "config.json").exists():
        build_tiny_model(d, arch="qwen2")
    return d


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


# ---------------------------------------------------------------- arithmetic


def test_arithmetic_default_split(tmp_path):
    paths = write_arithmetic_dataset(tmp_path, seed=1)
    train, ev, sft = (load_jsonl(paths[k]) for k in ("train", "eval", "sft"))
    assert num_problems(2) == 1000
    assert len(ev) == 200 and len(train) == 800
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in ev})
    assert len({r["prompt"] for r in train + ev}) == 1000
    for r in train + ev:
        a, b = r["prompt"][:-1].split("+")
        assert r["prompt"].endswith("=") and int(a) <= 99 and int(b) <= 9
        assert r["label"] == str(int(a) + int(b))
    assert len(sft) == len(train)
    for s, t in zip(sft, train, strict=True):
        assert s == {
            "messages": [
                {"role": "user", "content": t["prompt"]},
                {"role": "assistant", "content": "\\boxed{" + t["label"] + "}"},
            ]
        }
    # deterministic
    again = write_arithmetic_dataset(tmp_path / "again", seed=1)
    assert paths["train"].read_text() == again["train"].read_text()


@pytest.mark.parametrize("difficulty,a_max,b_max", [(1, 9, 9), (3, 99, 99), (4, 999, 999)])
def test_arithmetic_levels(tmp_path, difficulty, a_max, b_max):
    paths = write_arithmetic_dataset(tmp_path, difficulty=difficulty, num_train=300, num_eval=20)
    train, ev = load_jsonl(paths["train"]), load_jsonl(paths["eval"])
    assert len(train) == 300 and len(ev) == 20
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in ev})
    for r in train:
        a, b = map(int, r["prompt"][:-1].split("+"))
        assert a <= a_max and b <= b_max


def test_arithmetic_small_space_repeats_train_only(tmp_path):
    # difficulty 1 has 100 problems; 20 held out by default, train repeats the other 80
    paths = write_arithmetic_dataset(tmp_path, difficulty=1, num_train=200)
    train, ev = load_jsonl(paths["train"]), load_jsonl(paths["eval"])
    assert len(ev) == 20 and len(train) == 200
    assert len({r["prompt"] for r in train}) == 80
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in ev})


def test_arithmetic_errors_and_cli(tmp_path, capsys):
    with pytest.raises(SlimeError, match="--difficulty"):
        write_arithmetic_dataset(tmp_path, difficulty=7)
    with pytest.raises(SlimeError, match="--num-eval"):
        write_arithmetic_dataset(tmp_path, difficulty=1, num_eval=100)
    with pytest.raises(SlimeError, match="--num-train"):
        write_arithmetic_dataset(tmp_path, num_train=0)
    assert arithmetic.main(["--out", str(tmp_path / "d"), "--num-train", "50", "--num-eval", "10"]) == 0
    out = capsys.readouterr().out
    assert "train: 50 rows" in out and "eval: 10 rows" in out and "sft: 50 rows" in out


# ---------------------------------------------------------------- load_jsonl / load_prompt_samples


def test_load_jsonl_errors(tmp_path):
    p = _write(tmp_path / "d.jsonl", ['{"a": 1}', "", '{"a": 2'])
    with pytest.raises(SlimeError, match=r"d\.jsonl: line 3: malformed JSON"):
        load_jsonl(p)
    p2 = _write(tmp_path / "e.jsonl", ['{"a": 1}', "   ", "[1, 2]"])
    with pytest.raises(SlimeError, match=r"e\.jsonl: line 3: expected a JSON object"):
        load_jsonl(p2)
    with pytest.raises(SlimeError, match=r"nope\.jsonl.*does not exist"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(SlimeError, match="not a regular file"):
        load_jsonl(tmp_path)
    (tmp_path / "bin.jsonl").write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(SlimeError, match=r"bin\.jsonl: line 2: not valid UTF-8"):
        load_jsonl(tmp_path / "bin.jsonl")
    assert load_jsonl(_write(tmp_path / "ok.jsonl", ['{"a": 1}', "", '{"a": 2}'])) == [{"a": 1}, {"a": 2}]


def test_a_row_nested_too_deep_is_named_not_a_recursion_traceback(tmp_path):
    from slime.data.dataset import MAX_JSON_DEPTH

    deep = '{"prompt": "1+1=", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    p = _write(tmp_path / "deep.jsonl", ['{"prompt": "1+1="}', deep])
    with pytest.raises(SlimeError, match=rf"deep\.jsonl: line 2: JSON nested deeper than {MAX_JSON_DEPTH}"):
        load_prompt_samples(p, input_key="prompt")
    # deep enough to parse, too deep to keep (copy.deepcopy of a few hundred levels fails later)
    nested = '{"prompt": "1+1=", "meta": ' + "[" * 300 + "]" * 300 + "}"
    p2 = _write(tmp_path / "nested.jsonl", [nested])
    with pytest.raises(SlimeError, match=r"nested\.jsonl: line 1: 'meta'(\[0\])+ is nested deeper than"):
        load_prompt_samples(p2, input_key="prompt")
    ok = '{"prompt": "1+1=", "meta": ' + "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1) + "}"
    assert len(load_prompt_samples(_write(tmp_path / "ok.jsonl", [ok]), input_key="prompt")) == 1
    # the same bound inside a metadata or tools column given as a JSON string
    meta = json.dumps({"prompt": "1+1=", "m": "[" * 100_000 + "]" * 100_000})
    with pytest.raises(SlimeError, match=r"m\.jsonl: line 1: 'm' \(--metadata-key\) must be an object"):
        load_prompt_samples(_write(tmp_path / "m.jsonl", [meta]), input_key="prompt", metadata_key="m")
    tools = json.dumps({"prompt": "1+1=", "t": "[" * 100_000 + "]" * 100_000})
    with pytest.raises(SlimeError, match=r"t\.jsonl: line 1: 't' \(--tool-key\) is nested deeper"):
        load_prompt_samples(_write(tmp_path / "t.jsonl", [tools]), input_key="prompt", tool_key="t")


def test_a_line_over_the_length_limit_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    from slime.data import dataset

    monkeypatch.setattr(dataset, "MAX_LINE_BYTES", 1024)
    p = _write(tmp_path / "long.jsonl", ['{"prompt": "1+1="}', json.dumps({"prompt": "x" * 2000})])
    with pytest.raises(SlimeError, match=r"long\.jsonl: line 2: longer than"):
        load_prompt_samples(p, input_key="prompt")
    fits = json.dumps({"prompt": "x" * 1000})
    assert len(load_prompt_samples(_write(tmp_path / "fits.jsonl", [fits, fits]), input_key="prompt")) == 2


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ('{"prompt": "2+2=\\ud800"}', "'prompt'"),  # a lone high surrogate, as JSON escapes it
        ('{"prompt": "ok", "label": "\\udc00x"}', "'label'"),
        ('{"prompt": [{"role": "user", "content": "a\\ud83d"}]}', "'prompt'[0]['content']"),
        ('{"prompt": "ok", "meta": {"\\udfff": 1}}', "'meta'['\\udfff']"),
    ],
)
def test_a_string_that_is_not_valid_unicode_is_named_with_file_line_and_key(tmp_path, row, where):
    """JSON can carry a lone surrogate; no tokenizer can encode it (the load used to pass and the
    rollout fail with a TypeError traceback)."""
    p = _write(tmp_path / "s.jsonl", ['{"prompt": "1+1=", "label": "2"}', row])
    with pytest.raises(SlimeError) as e:
        load_prompt_samples(p, input_key="prompt", label_key="label" if "label" in row else None)
    msg = str(e.value)
    assert "s.jsonl: line 2: " in msg and where in msg and "not valid Unicode" in msg, msg
    good = '{"prompt": "d\\u00e9j\\u00e0 \\ud83d\\ude00 = \u00e9"}'  # a valid surrogate pair is one emoji
    [sample] = load_prompt_samples(_write(tmp_path / "g.jsonl", [good]), input_key="prompt")
    assert sample.prompt == "d\u00e9j\u00e0 \U0001f600 = \u00e9"


def test_load_prompt_samples_missing_key(tmp_path):
    p = _write(tmp_path / "p.jsonl", ['{"prompt": "1+1=", "label": "2"}', "", '{"question": "2+2=", "label": "4"}'])
    with pytest.raises(SlimeError) as e:
        load_prompt_samples(p, input_key="prompt", label_key="label")
    msg = str(e.value)
    assert "p.jsonl" in msg and "line 3" in msg and "'prompt'" in msg and "--input-key" in msg
    assert "['label', 'question']" in msg
    p2 = _write(tmp_path / "q.jsonl", ['{"prompt": "1+1=", "label": "2"}', '{"prompt": "2+2="}'])
    with pytest.raises(SlimeError, match=r"q\.jsonl: line 2: no key 'label' \(--label-key\)"):
        load_prompt_samples(p2, input_key="prompt", label_key="label")
    p3 = _write(tmp_path / "r.jsonl", ['{"prompt": 5}'])
    with pytest.raises(SlimeError, match=r"r\.jsonl: line 1: 'prompt' must be a string"):
        load_prompt_samples(p3, input_key="prompt")


def test_load_prompt_samples_plain(tmp_path):
    rows = [
        {"prompt": "1+1=", "label": 2, "metadata": {"rm_type": "math"}},
        {"prompt": "2+2=", "label": "4"},
        {"prompt": [{"role": "user", "content": "hi"}], "label": {"x": 1}, "metadata": '{"k": 3}'},
    ]
    p = _write(tmp_path / "p.jsonl", [json.dumps(r) for r in rows])
    samples = load_prompt_samples(p, input_key="prompt", label_key="label", metadata_key="metadata")
    assert isinstance(samples, PromptSamples) and samples.num_dropped == 0
    assert all(isinstance(s, Sample) for s in samples)
    assert [s.prompt for s in samples] == ["1+1=", "2+2=", [{"role": "user", "content": "hi"}]]
    assert [s.label for s in samples] == [2, "4", {"x": 1}]  # as the file holds them (slime keeps them so)
    assert [s.metadata for s in samples] == [{"rm_type": "math"}, {}, {"k": 3}]
    # the loaded prompt does not alias the row (mutating one sample never leaks)
    samples[2].prompt[0]["content"] = "changed"
    bad = _write(tmp_path / "b.jsonl", ['{"prompt": "x", "metadata": [1]}'])
    with pytest.raises(SlimeError, match=r"b\.jsonl: line 1: 'metadata' \(--metadata-key\) must be an object"):
        load_prompt_samples(bad, input_key="prompt", metadata_key="metadata")
    bad2 = _write(tmp_path / "c.jsonl", ['{"prompt": [{"content": "no role"}]}'])
    with pytest.raises(SlimeError, match=r"c\.jsonl: line 1: .*chat messages"):
        load_prompt_samples(bad2, input_key="prompt")


def test_load_prompt_samples_chat_template_and_max_len(tmp_path, tokenizer):
    rows = [
        {"q": "57+8=", "label": "65"},
        {"q": [{"role": "system", "content": "S"}, {"role": "user", "content": "1+2="}], "label": "3"},
        {"q": "1" * 50, "label": "x"},
    ]
    p = _write(tmp_path / "p.jsonl", [json.dumps(r) for r in rows])
    samples = load_prompt_samples(p, input_key="q", label_key="label", tokenizer=tokenizer, apply_chat_template=True)
    assert [s.prompt for s in samples[:2]] == [
        "<|user|>57+8=<|end|><|assistant|>",
        "<|system|>S<|end|><|user|>1+2=<|end|><|assistant|>",
    ]
    short = load_prompt_samples(
        p, input_key="q", label_key="label", tokenizer=tokenizer, apply_chat_template=True, max_prompt_len=20
    )
    assert len(short) == 2 and short.num_dropped == 1
    # without the template, a messages list is kept; length is measured on its rendering
    raw = load_prompt_samples(p, input_key="q", tokenizer=tokenizer, max_prompt_len=8)
    assert [s.prompt for s in raw] == ["57+8="] and raw.num_dropped == 2
    with pytest.raises(SlimeError, match="needs a tokenizer"):
        load_prompt_samples(p, input_key="q", apply_chat_template=True)


def test_load_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["1+1=", "2+3="], "label": ["2", "5"]}), tmp_path / "d.parquet")
    samples = load_prompt_samples(tmp_path / "d.parquet", input_key="prompt", label_key="label")
    assert [(s.prompt, s.label) for s in samples] == [("1+1=", "2"), ("2+3=", "5")]
    with pytest.raises(SlimeError, match=r"d\.parquet: row 0: no key 'question'"):
        load_prompt_samples(tmp_path / "d.parquet", input_key="question")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(SlimeError, match=r"cannot read Parquet file .*bad\.parquet"):
        load_prompt_samples(tmp_path / "bad.parquet", input_key="prompt")


# ---------------------------------------------------------------- RolloutDataSource


def _args(path, **kw):
    return make_args(
        **{
            "prompt_data": str(path),
            "input_key": "prompt",
            "label_key": "label",
            "rollout_seed": 7,
            "n_samples_per_prompt": 3,
            **kw,
        }
    )


@pytest.fixture
def prompts(tmp_path):
    return _write(tmp_path / "p.jsonl", [json.dumps({"prompt": f"{i}+0=", "label": str(i)}) for i in range(5)])


def test_data_source_groups_and_epochs(prompts):
    ds = RolloutDataSource(_args(prompts))
    g = ds.get_samples(2)
    assert len(g) == 2 and all(len(x) == 3 for x in g)
    assert [[s.group_index for s in x] for x in g] == [[0, 0, 0], [1, 1, 1]]
    assert [s.index for x in g for s in x] == list(range(6))
    assert [x[0].prompt for x in g] == ["0+0=", "1+0="]
    g[0][0].metadata["touched"] = True
    assert g[0][1].metadata == {} and ds.dataset[0].metadata == {}
    more = ds.get_samples(4)  # crosses into epoch 1
    assert [x[0].prompt for x in more] == ["2+0=", "3+0=", "4+0=", "0+0="]
    assert ds.epoch == 1 and ds.offset == 1
    assert more[-1][-1].index == 17 and more[-1][0].group_index == 5


def test_data_source_shuffle_deterministic(prompts):
    def order(seed, n=15):
        ds = RolloutDataSource(_args(prompts, rollout_shuffle=True, rollout_seed=seed, n_samples_per_prompt=1))
        return [g[0].prompt for g in ds.get_samples(n)]

    a, b = order(7), order(7)
    assert a == b
    epochs = [a[0:5], a[5:10], a[10:15]]
    assert all(sorted(e) == [f"{i}+0=" for i in range(5)] for e in epochs)  # each epoch a permutation
    assert len({tuple(e) for e in epochs}) > 1  # reshuffled per epoch
    assert order(8) != a


def test_data_source_state_restore(prompts, tmp_path):
    args = _args(prompts, rollout_shuffle=True)
    ref = RolloutDataSource(args)
    ref.get_samples(3)
    ds = RolloutDataSource(args)
    ds.get_samples(3)
    path = ds.save(tmp_path / "state" / "ds.json")
    expected = ref.get_samples(6)

    resumed = RolloutDataSource(args)
    resumed.load(path)
    got = resumed.get_samples(6)
    assert [[(s.prompt, s.group_index, s.index) for s in x] for x in got] == [
        [(s.prompt, s.group_index, s.index) for s in x] for x in expected
    ]
    assert resumed.state_dict() == ref.state_dict()

    other = _write(tmp_path / "o.jsonl", ['{"prompt": "a", "label": "b"}'])
    with pytest.raises(SlimeError, match="saved for 5 prompts"):
        RolloutDataSource(_args(other)).load(path)
    with pytest.raises(SlimeError, match="does not exist"):
        resumed.load(tmp_path / "missing.json")


def test_data_source_chat_template_and_errors(prompts, tiny_dir, tmp_path):
    ds = RolloutDataSource(
        _args(prompts, apply_chat_template=True, hf_checkpoint=str(tiny_dir), n_samples_per_prompt=1)
    )
    assert ds.get_samples(1)[0][0].prompt == "<|user|>0+0=<|end|><|assistant|>"
    with pytest.raises(SlimeError, match="--hf-checkpoint is not set"):
        RolloutDataSource(_args(prompts, apply_chat_template=True))
    with pytest.raises(SlimeError, match="--hf-checkpoint"):
        RolloutDataSource(_args(prompts, apply_chat_template=True, hf_checkpoint=str(tmp_path / "none")))
    empty = _write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(SlimeError, match="holds no prompts"):
        RolloutDataSource(_args(empty))
    with pytest.raises(SlimeError, match="--prompt-data"):
        RolloutDataSource(_args(prompts, prompt_data=None)).get_samples(1)


def test_group_copies_are_independent_like_deepcopy():
    """The n copies of a prompt (a field-by-field copy instead of copy.deepcopy) equal a
    deepcopy and share nothing mutable with the prompt or with each other."""
    import copy

    from slime.data.data_source import independent_copy
    from slime.utils.types import Sample

    prompt = Sample(
        prompt=[{"role": "user", "content": "1+1="}],
        label="2",
        metadata={"k": [1, {"x": 2}]},
        tokens=[5, 6],
        apply_chat_template_kwargs={"enable_thinking": False},
    )
    a, b = independent_copy(prompt), independent_copy(prompt)
    assert vars(a) == vars(copy.deepcopy(prompt)) == vars(prompt)
    a.prompt[0]["content"] = "changed"
    a.metadata["k"][1]["x"] = 3
    a.tokens.append(7)
    a.weight_versions.append("v1")
    a.apply_chat_template_kwargs["enable_thinking"] = True
    assert prompt.prompt[0]["content"] == "1+1=" and prompt.metadata == {"k": [1, {"x": 2}]}
    assert prompt.tokens == [5, 6] and prompt.weight_versions == [] and b.weight_versions == []
    assert prompt.apply_chat_template_kwargs == {"enable_thinking": False} == b.apply_chat_template_kwargs
    assert b.prompt[0]["content"] == "1+1=" and b.status == prompt.status
