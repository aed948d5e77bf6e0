"""TrajectoryManager on recorded turns: segments, masks, log-probs and versions, computed here by
hand from the turns (no engine)."""

from __future__ import annotations

from slime.agent.trajectory import TrajectoryManager, TurnRecord
from slime.utils.types import Sample

BASE = Sample(index=7, group_index=3, prompt="p", label="5", metadata={"task": "add"})


def turn(prompt, out, finish="stop", version="v1"):
    return TurnRecord(
        prompt_ids=list(prompt),
        output_ids=list(out),
        finish_reason=finish,
        output_log_probs=[-0.1 * (i + 1) for i in range(len(out))],
        weight_version=version,
    )


def msgs(n):
    return [{"role": "user", "content": str(i)} for i in range(n)]


def test_turns_that_extend_each_other_are_one_sample_with_exact_masks():
    m = TrajectoryManager()
    t1 = turn([1, 2, 3], [10, 11, 99])
    t2 = turn([1, 2, 3, 10, 11, 99, 4, 5], [12, 99], version="v2")  # tool result 4, 5 appended
    t3 = turn([1, 2, 3, 10, 11, 99, 4, 5, 12, 99, 6], [13], finish="length", version="v2")
    for t in (t1, t2, t3):
        m.record_turn("s", turn=t, prompt_messages=msgs(1), response_message={"role": "assistant", "content": ""})
    [s] = m.get_trajectory("s", base_sample=BASE, reward=1.0)
    assert s.tokens == [1, 2, 3, 10, 11, 99, 4, 5, 12, 99, 6, 13]
    assert s.response_length == 9
    assert s.loss_mask == [1, 1, 1, 0, 0, 1, 1, 0, 1]
    assert s.rollout_log_probs == [-0.1, -0.2, -0.30000000000000004, 0.0, 0.0, -0.1, -0.2, 0.0, -0.1]
    assert s.weight_versions == ["v1", "v2", "v2"]
    assert s.status == Sample.Status.COMPLETED and s.metadata["truncated"]  # the last turn ran out of tokens
    assert (s.index, s.group_index, s.rollout_id, s.reward, s.session_id) == (7, 3, 7, 1.0, "s")
    assert s.metadata["task"] == "add" and s.metadata["num_segments"] == 1
    assert [t["role"] for t in s.metadata["turns"]] == ["model", "context", "model", "context", "model"]
    assert m.get_trajectory("s", base_sample=BASE) == []  # consumed


def test_a_rewritten_history_starts_a_segment_and_an_interleaved_subagent_keeps_its_own():
    m = TrajectoryManager()
    rec = []
    main1 = turn([1, 2], [10, 99])
    sub1 = turn([50, 51], [60, 99])  # a sub-agent with its own context
    main2 = turn([1, 2, 10, 99, 3], [11, 99])  # extends main1
    sub2 = turn([50, 51, 60, 99, 52], [61, 99])  # extends sub1
    compact = turn([1, 7, 3], [12, 99])  # the agent summarised its history: no prefix
    for t in (main1, sub1, main2, sub2, compact):
        m.record_turn("s", turn=t, prompt_messages=msgs(1), response_message=None)
        rec.append(t)
    samples = m.get_trajectory("s", base_sample=BASE, reward=0.5)
    assert [s.tokens for s in samples] == [[1, 2, 10, 99, 3, 11, 99], [50, 51, 60, 99, 52, 61, 99], [1, 7, 3, 12, 99]]
    assert [s.loss_mask for s in samples] == [[1, 1, 0, 1, 1], [1, 1, 0, 1, 1], [1, 1]]
    assert [s.metadata["segment"] for s in samples] == [0, 1, 2]
    assert {s.rollout_id for s in samples} == {7} and {s.reward for s in samples} == {0.5}
    # every generated token is trained exactly once over the segments
    trained = sum(sum(s.loss_mask) for s in samples)
    assert trained == sum(len(t.output_ids) for t in rec)


def test_empty_session_cut_and_drop():
    m = TrajectoryManager()
    assert m.get_trajectory("never", base_sample=BASE) == []
    m.record_turn("s", turn=turn([1, 2, 3], [10, 11, 12, 13]), prompt_messages=msgs(1), response_message=None)
    [s] = m.get_trajectory("s", base_sample=BASE, max_sample_tokens=5)
    assert s.tokens == [1, 2, 3, 10, 11] and s.loss_mask == [1, 1] and s.metadata["truncated"]
    m.record_turn("d", turn=turn([1], [2]), prompt_messages=msgs(1), response_message=None)
    m.drop_session("d")
    assert not m.has_session("d")


def test_match_history_finds_the_replayed_reply():
    m = TrajectoryManager()
    reply = {"role": "assistant", "content": "hi"}
    t = turn([1], [2])
    m.record_turn("s", turn=t, prompt_messages=msgs(1), response_message=reply)
    assert m.match_history("s", msgs(1) + [reply, {"role": "user", "content": "more"}]) == (1, t)
    assert m.match_history("s", [{"role": "user", "content": "edited"}, reply]) is None
    assert m.match_history("s", msgs(1) + [{"role": "assistant", "content": "hi!"}]) is None
