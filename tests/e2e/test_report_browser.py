"""`slime report` of a short real run, opened in headless Chromium (Debian's chromium +
chromium-driver, driven by selenium; scripts/setup.sh installs them).

One short multi-turn run (a tool answers between the model's turns, so responses hold trained
and tool tokens; the flaky reward FAILS samples 3, 13, 23, ...) with evaluation and a save at every
step; then the browser checks that the curves have data points, that the rollout browser lists
the logged groups, that a click on a sample shows its tokens in both mask colours, and that a
FAILED sample shows its error. Reports of a run without eval points, with a torn metrics line,
and of a directory that is not a run directory render with their notes. Screenshots go to the
test's tmp dir (and to $SLIME_TEST_ARTIFACTS when set).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]  # one real run: ~1.5-2 min on 2 cores

GROUPS_LOGGED = 3
TOOL_TEXT = " -> tool: 7;"


async def tool_generate(args, sample, sampling_params):
    """Two model turns with a tool's answer between them (a --custom-generate-function-path)."""
    from slime.rollout.multi_turn import run_multi_turn

    async def env_step(text, trajectory):
        return TOOL_TEXT if trajectory.num_model_turns < 2 else None

    return await run_multi_turn(args, sample, sampling_params, env_step, max_turns=2, max_new_tokens_per_turn=5)


@pytest.fixture(scope="module")
def report_run(ray_cluster, tiny_model_dir, task_dir, tmp_path_factory):
    from slime.arguments import parse_args
    from slime.train import finish_run, train

    run_dir = tmp_path_factory.mktemp("report-run")
    argv = [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--custom-generate-function-path",
        "tests.e2e.test_report_browser.tool_generate",
        "--custom-rm-path",
        "tests.e2e.hooks.flaky_digit_reward",
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "24",
        "--global-batch-size",
        "16",
        "--micro-batch-size",
        "8",
        "--lr",
        "1e-3",
        "--colocate",
        "--report-groups-per-rollout",
        str(GROUPS_LOGGED),
        "--eval-interval",  # slime evaluates on an interval only
        "2",
        "--eval-prompt-data",
        "arith",
        str(task_dir / "eval.jsonl"),
        "--eval-temperature",
        "0",
        "--run-dir",
        str(run_dir),
        "--save-interval",
        "1",
    ]
    args = parse_args(argv)
    train(args)
    finish_run(args)
    return args, run_dir


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser():
    found = _chromium()
    if found is None:
        pytest.skip(
            "headless Chromium is not installed (Debian: apt-get install chromium chromium-driver; "
            "scripts/setup.sh does it where apt-get is available)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1500,1100",
        "--disable-extensions",
        "--no-first-run",
    ):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(found[1]))
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver, page: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page.resolve().as_uri())
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors  # the page's script ran without an error


def _screenshot(driver, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    driver.save_screenshot(str(out))
    art = os.environ.get("SLIME_TEST_ARTIFACTS")
    if art:
        Path(art).mkdir(parents=True, exist_ok=True)
        shutil.copy(out, Path(art) / name)
    assert out.stat().st_size > 10_000
    return out


def _logs(run_dir: Path) -> dict[str, dict]:
    return {
        p.name: json.loads(p.read_text())
        for p in sorted((run_dir / "samples").glob("*_*.json"))
        if ".adv." not in p.name
    }


def test_run_leaves_sample_logs_with_advantages_and_a_report(report_run):
    _, run_dir = report_run
    logs = _logs(run_dir)
    assert {"rollout_000000.json", "rollout_000001.json", "eval_-00001.json", "eval_000001.json"} <= set(logs)
    assert (run_dir / "report.html").stat().st_size > 20_000 and (run_dir / "run_facts.json").exists()
    statuses = set()
    for rid in (0, 1):
        log = logs[f"rollout_{rid:06d}.json"]
        assert (log["num_groups"], log["num_samples"], len(log["groups"])) == (4, 16, GROUPS_LOGGED)
        adv: dict[str, list[float]] = {}
        for f in (run_dir / "samples").glob(f"rollout_{rid:06d}.adv.rank*.json"):
            adv.update(json.loads(f.read_text())["advantages"])
        for g in log["groups"]:
            samples = g["samples"]
            assert len(samples) == 4
            for s in samples:
                statuses.add(s["status"])
                n = s["response_length"]
                assert len(s["response_ids"]) == len(s["loss_mask"]) == n == len(s["response_tokens"])
                if s["status"] == "failed":
                    assert "reward service unavailable" in s["error"] and s["reward"] is None
                    continue
                assert len(s["log_probs"]) == n and s["turns"] and s["weight_versions"]
                # the tool's tokens are exactly the env turn, masked out; the model's turns are trained
                for t in s["turns"]:
                    assert set(s["loss_mask"][t["start"] : t["end"]]) <= {1 if t["role"] == "model" else 0}
                    if t["role"] == "env":
                        assert "".join(s["response_tokens"][t["start"] : t["end"]]) == TOOL_TEXT
            # GRPO's advantage, computed here: (r - group mean) / (unbiased std + 1e-6) over the
            # group's valid samples, on every response token; a FAILED sample gets 0
            valid = [s for s in samples if s["status"] not in ("failed", "aborted")]
            rewards = [s["reward"] for s in valid]
            mean, std = statistics.mean(rewards), statistics.stdev(rewards)
            for s in samples:
                got = adv[str(s["train_index"])]
                want = (s["reward"] - mean) / (std + 1e-6) if s in valid else 0.0
                assert got == pytest.approx([want] * s["response_length"], abs=1e-4)
    assert "failed" in statuses  # sample 3 (rollout 0, group 0) failed its reward


def test_report_in_chromium_shows_curves_groups_tokens_and_failed_samples(report_run, browser, tmp_path):
    from selenium.webdriver.common.by import By

    _, run_dir = report_run
    _open(browser, run_dir / "report.html")
    charts = {c.get_attribute("data-title"): c for c in browser.find_elements(By.CSS_SELECTOR, ".chart-box")}
    for title in (
        "Reward",
        "Evaluation (incl. pass@k)",
        "Response length",
        "Grad norm",
        "Step time: rollout / train / weight sync / eval (s)",
    ):
        svg = charts[title].find_element(By.CSS_SELECTOR, "svg.chart")
        assert int(svg.get_attribute("data-points")) >= 2, title
        assert svg.find_elements(By.CSS_SELECTOR, "circle.pt"), title
    # every chart's tick labels tell the ticks apart (they once read "5.752" four times)
    for title, box in charts.items():
        labels = [t.text for t in box.find_elements(By.CSS_SELECTOR, "svg.chart text.ytick")]
        assert len(labels) >= 2 and len(set(labels)) == len(labels), (title, labels)
    assert "Staleness (async)" not in charts  # a synchronous run: on policy throughout, no chart
    # the summary on top: the eval set's scores, the reward trend, the wall time split
    summary = browser.find_element(By.ID, "summary").text
    for word in ("arith", "eval/arith", "rollout/raw_reward", "start-up", "rollout", "train", "weight sync"):
        assert word in summary, word
    time_keys = charts["Step time: rollout / train / weight sync / eval (s)"].text
    assert "perf/rollout_time" in time_keys and "perf/train_time" in time_keys
    assert "perf/update_weights_time" in time_keys

    # hover: a read-out with the values at the nearest step
    from selenium.webdriver import ActionChains

    reward_svg = charts["Reward"].find_element(By.CSS_SELECTOR, "svg.chart")
    ActionChains(browser).move_to_element(reward_svg).perform()
    assert "rollout/raw_reward =" in browser.find_element(By.ID, "tooltip").text
    # zoom: drag across the left part of the chart; fewer points are drawn, double-click resets
    before = int(reward_svg.get_attribute("data-points"))
    ActionChains(browser).move_to_element_with_offset(reward_svg, -180, 0).click_and_hold().move_by_offset(
        120, 0
    ).release().perform()
    reward_svg = browser.find_element(By.CSS_SELECTOR, '.chart-box[data-title="Reward"] svg.chart')
    assert int(reward_svg.get_attribute("data-points")) < before
    ActionChains(browser).double_click(reward_svg).perform()
    reward_svg = browser.find_element(By.CSS_SELECTOR, '.chart-box[data-title="Reward"] svg.chart')
    assert int(reward_svg.get_attribute("data-points")) == before

    # the browser opens on the last training rollout: every logged group
    assert len(browser.find_elements(By.CSS_SELECTOR, "#groups .group")) == GROUPS_LOGGED
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, "rollout-select")).select_by_visible_text("rollout 0 (metrics step 1)")
    groups = browser.find_elements(By.CSS_SELECTOR, "#groups .group")
    assert len(groups) == GROUPS_LOGGED
    assert "FAILED" in browser.find_element(By.ID, "rollout-note").text
    rows = browser.find_elements(By.CSS_SELECTOR, "#groups .sample")
    assert len(rows) == 4 * GROUPS_LOGGED

    # a trained sample: its tokens, in both mask colours, turn by turn
    ok = [r for r in rows if r.get_attribute("data-status") != "failed"]
    ok[0].click()
    detail = browser.find_element(By.ID, "sample-detail")
    assert detail.find_elements(By.CSS_SELECTOR, ".tok.m1") and detail.find_elements(By.CSS_SELECTOR, ".tok.m0")
    assert len(detail.find_elements(By.CSS_SELECTOR, ".turn.model")) == 2
    assert len(detail.find_elements(By.CSS_SELECTOR, ".turn.env")) == 1

    def rgb(selector: str) -> tuple[str, ...]:
        colour = detail.find_element(By.CSS_SELECTOR, selector).value_of_css_property("background-color")
        return tuple(colour.split("(")[1].split(",")[:3])

    assert rgb(".tok.m1") != rgb(".tok.m0")  # trained and tool tokens really look different
    browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, "browser"))
    _screenshot(browser, tmp_path, "report_sample.png")

    # a FAILED sample shows why; the status filter hides it
    failed = [r for r in rows if r.get_attribute("data-status") == "failed"]
    assert failed
    failed[0].click()
    assert "reward service unavailable" in browser.find_element(By.CSS_SELECTOR, "#sample-detail .error").text
    browser.find_element(By.CSS_SELECTOR, '#status-filters input[data-status="failed"]').click()
    shown = browser.find_elements(By.CSS_SELECTOR, "#groups .sample")
    assert len(shown) == len(rows) - len(failed)
    # reward filter: only samples with reward >= 0.5
    browser.find_element(By.ID, "reward-min").send_keys("0.5")
    log = _logs(run_dir)["rollout_000000.json"]
    want = sum(
        1
        for g in log["groups"]
        for s in g["samples"]
        if s["status"] != "failed" and s["reward"] is not None and s["reward"] >= 0.5
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, "#groups .sample")) == want

    facts = browser.find_element(By.ID, "facts").text
    for word in ("torch", "transformers", "ray", "cpu_count", "rollout_batch_size", "Wall time per stage"):
        assert word in facts, word
    browser.execute_script("window.scrollTo(0, 0)")
    _screenshot(browser, tmp_path, "report_top.png")
    if os.environ.get("SLIME_TEST_ARTIFACTS"):  # the page itself, to open by hand
        shutil.copy(run_dir / "report.html", Path(os.environ["SLIME_TEST_ARTIFACTS"]) / "report.html")


def test_reports_without_eval_with_a_torn_line_and_of_a_non_run_dir_render_with_notes(report_run, browser, tmp_path):
    from selenium.webdriver.common.by import By

    from slime.observability.report import write_report

    _, run_dir = report_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoints*", "iter_*", "*.safetensors", "*.pt"))
    rows = (copy / "metrics.jsonl").read_text().splitlines()
    no_eval = [json.dumps({k: v for k, v in json.loads(r).items() if not k.startswith("eval/")}) for r in rows]
    (copy / "metrics.jsonl").write_text("\n".join(no_eval) + "\n" + no_eval[-1][:25])  # torn last line
    page, _ = write_report(copy)
    _open(browser, page)
    notes = browser.find_element(By.ID, "notes").text
    assert "no evaluation points" in notes and "torn" in notes and "FAILED" in notes
    assert (
        int(
            browser.find_element(By.CSS_SELECTOR, '.chart-box[data-title="Reward"] svg.chart').get_attribute(
                "data-points"
            )
        )
        >= 2
    )
    assert browser.find_elements(By.CSS_SELECTOR, "#groups .group")
    _screenshot(browser, tmp_path, "report_notes.png")

    other = tmp_path / "not-a-run"
    other.mkdir()
    (other / "readme.txt").write_text("hello")
    page, _ = write_report(other)
    _open(browser, page)
    assert "is not a run directory" in browser.find_element(By.ID, "notes").text
    assert "No sample log" in browser.find_element(By.ID, "groups").text
