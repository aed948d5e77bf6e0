"""Each --rm-type gives slime's reward on slime's inputs (cases written from slime's rules)."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime.rollout.rm_hub import async_rm
from slime.rollout.rm_hub.remote import RemoteRewardError
from slime.utils.types import Sample
from tests.helpers import make_args


def rm(rm_type, response, label=None, metadata=None, **kw):
    args = make_args(rm_type=rm_type, **kw)
    return asyncio.run(async_rm(args, Sample(response=response, label=label, metadata=metadata or {})))


@pytest.mark.parametrize(
    "response,label,reward",
    [
        ("so \\boxed{65}", "65", 1),
        ("\\boxed{65.0}", "65", 1),
        ("\\boxed{64}", "65", 0),
        ("\\boxed{64} no \\boxed{65}", "65", 1),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1),
        ("\\boxed{\\dfrac{1}{2}}", "0.5", 1),
        ("\\boxed{2/4}", "\\frac{1}{2}", 0),  # unreduced fractions differ
        ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", 1),
        ("\\boxed{x+1}", "1+x", 1),
        ("\\boxed{(1,2)}", "(1, 2)", 1),
        ("\\boxed{[1,2)}", "(1,2)", 0),
        ("\\boxed{1,000}", "1000", 1),
        ("\\boxed{10\\%}", "10", 1),
        ("\\boxed{k=3}", "3", 1),
        ("\\boxed{\\text{(A)}}", "(A)", 1),
        ("\\boxed{2\\pi}", "\\pi*2", 1),
        ("\\boxed{65}", "\\boxed{65}", 1),
        ("\\boxed 5", "5", 0),
        ("\\fbox{5}", "5", 0),
        ("65", "65", 0),  # only \boxed{...} is an answer
        ("\\boxed{5}", 5, 1),
        ("\\boxed{0}", 0, 0),
        ("\\boxed{5}", None, 0),  # a falsy label scores 0, as in slime
        ("\\boxed{6} and \\boxed{6", "6", 0),  # an unclosed last box is no answer
    ],
)
def test_math(response, label, reward):
    assert rm("math", response, label) == reward


@pytest.mark.parametrize(
    "response,label,reward",
    [
        ("<think>\\boxed{1}</think> so \\boxed{2}", "2", 1),
        ("<think>\\boxed{2}</think> no box after", "2", 0),  # only what follows </think> counts
        ("\\boxed{2}", "2", 0),  # neither </think> nor ###Response: 0
        ("prompt ###Response the answer is \\boxed{\\frac{1}{2}}", "0.5", 1),
        ("a</think>b</think>\\boxed{3}", "\\boxed{3}", 1),
        ("</think>\\boxed{3}", "", 0),
        ("</think>\\boxed{3}", 3, 1),
    ],
)
def test_deepscaler(response, label, reward):
    assert rm("deepscaler", response, label) == reward


def test_dapo():
    assert rm("dapo", "reasoning...\nAnswer: 42", "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert rm("dapo", "Answer: 41\nAnswer: 42", 42) == {"score": 1.0, "acc": True, "pred": "42"}  # the last one
    assert rm("dapo", "answer :  1,000 dollars", "1000")["score"] == 1.0
    assert rm("dapo", "Answer: $\\boxed{7}$", "7.0")["acc"] is True
    assert rm("dapo", "Answer: x = 5", "5")["pred"] == "5"
    assert rm("dapo", "no answer line \\boxed{42}", "42") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    assert rm("dapo", "Answer: 42" + " " * 280, "42")["acc"] is True
    assert rm("dapo", "Answer: 42\n" + "x" * 300, "42")["acc"] is False  # only the last 300 characters
    assert rm("dapo", "Answer: 43", "42")["score"] == -1.0
    # the trained scalar of a dict reward: --reward-key score
    s = Sample(reward=rm("dapo", "Answer: 1", "1"))
    assert s.get_reward_value(make_args(reward_key="score")) == 1.0
    with pytest.raises(ValueError):
        rm("dapo", "Answer: 1", "not a number")  # DAPO labels are integers: an error, not a silent 0


@pytest.mark.parametrize(
    "response,label,reward",
    [
        ("The Eiffel Tower", "eiffel tower", 1.0),
        ("Paris, France", "Paris", 2 * 0.5 * 1 / 1.5),
        ("yes", "no", 0),
        ("no", "no", 1.0),
        ("yes it is", "yes", 0),  # yes/no/noanswer exact
        ("", "x", 0),
        ("a the an", "the", 0),
    ],
)
def test_f1(response, label, reward):
    assert rm("f1", response, label) == pytest.approx(reward)


def test_boxed_prefix():
    assert rm("boxed_f1", "I think \\boxed{Paris}", "Paris") == 1.0
    assert rm("boxed_f1", "Paris without a box", "Paris") == 0  # "" when there is no box


@pytest.mark.parametrize(
    "response,label,metadata,reward",
    [
        ("The answer is B", "B", {}, 1.0),
        ("The answer is C", "B", {}, 0.0),
        ("<think>answer is A</think> Final answer: D", "D", {}, 1.0),
        ("I pick (C).", 2, {}, 1.0),  # an index label
        ("It is B", "blue", {"choices": ["red", "blue", "green"]}, 1.0),
        ("it must be green", "green", {"choices": ["red", "blue", "green"]}, 1.0),  # option text
        ("Answer: B", "x", {"correct_letter": "a", "choices": ["x", "y"]}, 0.0),
        ("no letter here", "A", {}, 0.0),
    ],
)
def test_gpqa(response, label, metadata, reward):
    assert rm("gpqa", response, label, metadata) == reward


def test_math_verify():
    assert rm("math_verify", "\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert rm("math_verify", "\\boxed{x^2+2x+1}", "(x+1)^2") == 1.0
    assert rm("math_verify", "\\boxed{3}", "4") == 0.0
    assert rm("math_verify", "3", "3") == 0.0


# ---------------------------------------------------------------------------- remote_rm


class _RMHandler(BaseHTTPRequestHandler):
    mode = "ok"
    calls = 0

    def log_message(self, *a):
        pass

    def do_POST(self):
        type(self).calls += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = type(self).mode
        if mode == "slow":
            import time

            time.sleep(1.0)
        if mode == "flaky" and type(self).calls < 3:
            self.send_response(503)
            self.end_headers()
            return
        text = {
            "ok": json.dumps(1.0 if body["response"] == body["label"] else 0.0),
            "dict": json.dumps({"score": 0.5, "extra": 1}),
            "garbage": "<html>oops</html>",
            "nan": "NaN",
            "flaky": "1",
            "slow": "1",
            "bad_request": "no",
        }[mode]
        try:
            self.send_response(400 if mode == "bad_request" else 200)
            self.end_headers()
            self.wfile.write(text.encode())
        except OSError:  # the client gave up (the timeout test)
            pass


@pytest.fixture
def rm_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RMHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _RMHandler.calls = 0
    yield f"http://127.0.0.1:{server.server_address[1]}/reward", _RMHandler
    server.shutdown()
    server.server_close()


def _remote(url, response, label="x", **kw):
    opts = dict(rm_url=url, rm_timeout=5, rm_max_retries=3, rm_retry_interval=0.01)
    opts.update(kw)
    return rm("remote_rm", response, label, **opts)


def test_remote_rm(rm_server):
    url, handler = rm_server
    handler.mode = "ok"
    assert _remote(url, "x") == 1.0 and _remote(url, "y") == 0.0
    handler.mode = "dict"
    assert _remote(url, "x") == {"score": 0.5, "extra": 1}
    handler.mode, handler.calls = "flaky", 0
    assert _remote(url, "x") == 1 and handler.calls == 3  # two 503s retried


@pytest.mark.parametrize("mode,match", [("garbage", "not JSON"), ("nan", "finite"), ("slow", "--rm-timeout")])
def test_remote_rm_gives_up_with_the_reason(rm_server, mode, match):
    url, handler = rm_server
    handler.mode, handler.calls = mode, 0
    with pytest.raises(RemoteRewardError, match=f"after 2 attempts.*{match}"):
        _remote(url, "x", rm_max_retries=2, rm_timeout=0.3)
    assert handler.calls == 2


def test_remote_rm_4xx_and_down():
    with pytest.raises(RemoteRewardError, match="failed after 2 attempts"):
        _remote("http://127.0.0.1:9/reward", "x", rm_max_retries=2)  # nothing listens on port 9


def test_remote_rm_bad_request_not_retried(rm_server):
    url, handler = rm_server
    handler.mode, handler.calls = "bad_request", 0
    with pytest.raises(RemoteRewardError, match="HTTP 400"):
        _remote(url, "x")
    assert handler.calls == 1


# ---------------------------------------------------------------------------- code

FAST = dict(
    sandbox_timeout=30, sandbox_cpu_time=2, sandbox_memory_mb=256
)  # wall >> CPU: a loaded machine still hits the CPU limit first


def test_code_reward_test_code():
    good = "Here:\n```python\ndef add(a, b):\n    return a + b\n```"
    tests = "assert add(1, 2) == 3\nassert add(-1, 1) == 0"
    assert rm("code", good, tests, **FAST) == 1.0
    assert rm("code", good.replace("a + b", "a - b"), tests, **FAST) == 0.0
    meta = {"tests": tests}
    s = Sample(response="```python\nwhile True: pass\n```", metadata=meta)
    args = make_args(rm_type="code", **FAST)
    assert asyncio.run(async_rm(args, s)) == 0.0
    assert "CPU-time" in s.metadata["code_result"]


def test_code_reward_io_cases():
    cases = [{"input": "2 3\n", "output": "5"}, {"input": "10 -4", "output": "6\n"}]
    assert (
        rm("code", "```py\na, b = map(int, input().split())\nprint(a + b)\n```", None, {"tests": cases}, **FAST) == 1.0
    )
    assert rm("code", "print(5)", None, {"tests": cases}, **FAST) == 0.0
    with pytest.raises(ValueError, match="no tests"):
        rm("code", "print(1)", None, {}, **FAST)
