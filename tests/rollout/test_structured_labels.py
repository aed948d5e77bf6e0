"""Labels kept as the data file holds them (slime keeps `data[label_key]` as it is): an object label
reaches a custom reward in the shape of slime's search-r1 example through the real loading path,
and survives the Data Buffer's state, the sample log and the report; the built-in rewards grade a
number label as its text and mark a sample whose label they cannot read FAILED, naming it."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime.data.data_source import RolloutDataSourceWithBuffer
from slime.observability.report_samples import sample_logs
from slime.observability.sample_log import read_sample_log, write_rollout_samples
from slime.ray.rollout import check_failed_samples
from slime.rollout import sglang_rollout
from slime.rollout.rm_hub import async_rm
from slime.rollout.train_data import rollout_metrics, samples_to_train_data
from slime.utils.types import Sample
from tests.helpers import make_args, stub_generate_state

HOOKS = "tests.rollout.structured_label_hooks"

# question -> (label, what the stand-in policy answers, the exact-match reward worked out by hand)
ROWS = {
    "capital of France?": ({"ground_truth": {"target": ["Paris", "Paris, France"]}}, "paris", 1.0),
    "2+2?": ({"ground_truth": {"target": ["4"]}, "data_source": "nq"}, "five", 0.0),
    "longest river?": ({"ground_truth": {"target": ["The Nile"]}}, "Nile.", 1.0),
}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def search_r1_data(tmp_path):
    rows = [{"question": q, "label": lab, "metadata": {"policy_answer": a}} for q, (lab, a, _) in ROWS.items()]
    return _write(tmp_path / "search_r1.jsonl", rows)


@pytest.fixture
def rollout(monkeypatch):
    """generate_and_rm_group over every group, the stand-in policy in place of the engine."""

    def run(args, groups):
        stub_generate_state(monkeypatch, args)
        for g in groups:
            asyncio.run(sglang_rollout.generate_and_rm_group(args, g, {"max_new_tokens": 4}))
        return groups

    yield run
    sglang_rollout.GenerateState.reset()


def _args(data, tmp_path, **kw):
    return make_args(
        prompt_data=data,
        input_key="question",
        label_key="label",
        metadata_key="metadata",
        rollout_batch_size=3,
        n_samples_per_prompt=2,
        custom_generate_function_path=f"{HOOKS}.answer_generate",
        run_dir=str(tmp_path / "run"),
        save=str(tmp_path / "ckpt"),
        **kw,
    )


def test_a_search_r1_reward_reads_the_object_label(search_r1_data, tmp_path, rollout):
    args = _args(search_r1_data, tmp_path, custom_rm_path=f"{HOOKS}.search_r1_reward")
    source = RolloutDataSourceWithBuffer(args)
    groups = source.get_samples(3)
    samples = [s for g in groups for s in g]
    assert [s.label for s in samples] == [ROWS[s.prompt][0] for s in samples]
    # each sample owns its label: a reward that edits one leaves the others (and the dataset) alone
    samples[0].label["ground_truth"]["target"].append("edited")
    assert samples[1].label == ROWS[samples[1].prompt][0]
    assert source.get_samples(3)[0][0].label == ROWS[samples[0].prompt][0]
    samples[0].label = json.loads(json.dumps(ROWS[samples[0].prompt][0]))

    rollout(args, groups)
    assert [s.status for s in samples] == [Sample.Status.COMPLETED] * 6
    assert [s.reward for s in samples] == [ROWS[s.prompt][2] for s in samples]

    # the Data Buffer's state (JSON in the checkpoint) gives the object back
    source.add_samples([groups[1]])
    source.save(0)
    resumed = RolloutDataSourceWithBuffer(_args(search_r1_data, tmp_path, load=str(tmp_path / "ckpt")))
    resumed.load(0)
    assert [s.label for s in resumed.get_samples(1)[0]] == [g.label for g in groups[1]]
    assert Sample.from_dict(json.loads(json.dumps(samples[0].to_dict()))).label == samples[0].label

    # the sample log holds it as JSON; the report's rollout browser shows its JSON text
    (tmp_path / "run").mkdir()
    path = write_rollout_samples(args, groups, 0)
    logged, _ = read_sample_log(path)
    assert [s["label"] for g in logged["groups"] for s in g["samples"]] == [s.label for s in samples]
    shown = sample_logs(tmp_path / "run", [], None, 10**7)[0]["groups"][0]["samples"][0]["label"]
    assert json.loads(shown) == samples[0].label and isinstance(shown, str)


def test_a_builtin_reward_fails_the_samples_whose_label_it_cannot_read(search_r1_data, tmp_path, rollout):
    args = _args(search_r1_data, tmp_path, rm_type="math")
    groups = rollout(args, RolloutDataSourceWithBuffer(args).get_samples(3))
    samples = [s for g in groups for s in g]
    assert [s.status for s in samples] == [Sample.Status.FAILED] * 6 and all(s.reward is None for s in samples)
    error = samples[0].metadata["error"]
    assert error.startswith("reward: LabelTypeError: the 'math' reward grades a string or number label")
    assert "dict" in error and '"ground_truth"' in error and "--custom-rm-path" in error
    data = samples_to_train_data(args, groups)
    assert rollout_metrics(args, groups, data)["rollout/status/failed"] == 6
    with pytest.raises(Exception, match="FAILED"):  # every sample failed: over --max-failed-sample-ratio
        check_failed_samples(groups, 0, args.max_failed_sample_ratio)


def _rm(rm_type, response, label, metadata=None, **kw):
    sample = Sample(response=response, label=label, metadata=dict(metadata or {}))
    return asyncio.run(async_rm(make_args(rm_type=rm_type, **kw), sample))


@pytest.mark.parametrize(
    "rm_type,response,label,want",
    [
        # a number label grades as its text (slime's graders str() it)
        ("math", "so \\boxed{65}", 65, 1.0),
        ("math", "so \\boxed{65}", 64, 0.0),
        ("math", "so \\boxed{0}", 0, 0.0),  # slime's math scores a falsy label 0 before reading it
        ("deepscaler", "</think> \\boxed{0}", 0, 1),  # slime's deepscaler reads it
        ("math", "so \\boxed{2.5}", 2.5, 1.0),
        ("boxed_f1", "it is \\boxed{42}", 42, 1.0),
        ("deepscaler", "</think> \\boxed{12}", 12, 1),
        ("f1", "forty two", 42, 0.0),
        ("f1", "it is 42", 42, 0.5),
        ("dapo", "Answer: 34", 34, {"score": 1.0, "acc": True, "pred": "34"}),
        # gpqa: an integer label is the option's index
        ("gpqa", "The answer is C", 2, 1.0),
        ("gpqa", "The answer is C", 1, 0.0),
        # a structured label with the right option in the metadata: slime's gpqa reads the metadata
        ("gpqa", "The answer is B", {"id": 7}, 1.0),
    ],
)
def test_builtin_rewards_on_labels_that_are_not_strings(rm_type, response, label, want):
    metadata = {"correct_letter": "B"} if isinstance(label, dict) else None
    assert _rm(rm_type, response, label, metadata) == want


@pytest.mark.parametrize("rm_type", ["math", "deepscaler", "dapo", "f1", "math_verify", "gpqa", "boxed_f1"])
@pytest.mark.parametrize("label", [{"answer": "65"}, ["65"]])
def test_builtin_rewards_refuse_labels_they_cannot_read(rm_type, label):
    base = rm_type.removeprefix("boxed_")
    with pytest.raises(
        TypeError, match=rf"the '{base}' reward grades a string or number label.*{type(label).__name__}"
    ):
        _rm(rm_type, "</think> \\boxed{65} Answer: 65 The answer is A", label)


def test_code_reward_refuses_an_object_label():
    with pytest.raises(ValueError, match="no tests"):
        _rm("code", "print(1)", {"tests": "assert f() == 1"})


class _EchoLabel(BaseHTTPRequestHandler):
    received: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append(body["label"])
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"1")


def test_remote_rm_sends_the_label_as_it_is():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoLabel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        label = {"ground_truth": {"target": ["Paris"]}, "n": [1, 2.5, None, True]}
        url = f"http://127.0.0.1:{server.server_address[1]}/reward"
        assert _rm("remote_rm", "Paris", label, rm_url=url, rm_max_retries=1) == 1
        assert _EchoLabel.received == [label]
    finally:
        server.shutdown()
        server.server_close()
