"""The documentation holds together: the mkdocs site builds with --strict (every nav page exists,
every link between pages and every #anchor resolves), README.md stays a short front page that
opens with the two commands, every relative link in README.md and docs/*.md reaches a file (and a
heading, for #anchor links), and no page reads like a work log."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

try:
    import mkdocs  # the test extra's (scripts/setup.sh --tests installs it)
except ImportError:  # an older .venv: scripts/setup.sh --tests reinstalls when pyproject.toml changes
    mkdocs = None

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

OPENING = """# slime-rl

```bash
bash scripts/setup.sh && .venv/bin/slime train     # set up, then run the default RL job on CPU (~4–5 min on 2 cores)
bash scripts/test.sh                                # set up, then run the checks and the whole test suite (~27 min on 2 cores)
```
"""
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
WORK_LOG = re.compile(r"\bissues? #?\d+|\bthis session\b|\b(?:previous|next|last) session\b|\bthe issue's\b", re.I)


def _outside_fences(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a bash block is not a heading)."""
    lines, fence = [], None
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif fence is not None:
            if stripped.startswith(fence):
                fence = None
        else:
            lines.append(line)
    return lines


def _prose(text: str) -> list[str]:
    """The lines outside code: fenced blocks dropped, inline code blanked."""
    return [re.sub(r"(`+)(?:(?!\1).)+?\1", "``", line) for line in _outside_fences(text)]


def _slug_github(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _slug_mkdocs(title: str) -> str:  # Python-Markdown's toc.slugify
    value = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", value).strip().lower())


def _anchors(page: Path) -> tuple[set[str], set[str]]:
    """A page's heading anchors as GitHub renders them and as the mkdocs site does."""
    titles = [
        m.group(1).replace("`", "")
        for line in _outside_fences(page.read_text())
        if (m := re.match(r"#{1,6}\s+(.*?)\s*$", line))
    ]
    return {_slug_github(t) for t in titles}, {_slug_mkdocs(t) for t in titles}


def _links(page: Path) -> list[str]:
    return [m.group(1) for line in _prose(page.read_text()) for m in LINK.finditer(line)]


@pytest.mark.skipif(mkdocs is None, reason="mkdocs is not installed: bash scripts/setup.sh --tests")
def test_the_site_builds_strictly(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.name for p in DOCS.glob("*.md") if not re.search(rf":\s*{re.escape(p.name)}\s*$", nav, re.M)]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


def test_readme_is_a_short_front_page_that_opens_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, f"README.md has {len(text.splitlines())} lines; move detail into docs/"
    assert text.startswith(OPENING), "README.md must open with the title and the two commands (setup + train, test)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(page):
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if anchor and dest.suffix == ".md":
            github, site = _anchors(dest)
            if anchor not in github or anchor not in site:
                broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_work_log_language(page):
    hits = [
        f"line {n}: {line.strip()[:100]}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if WORK_LOG.search(line)
    ]
    assert not hits, f"{page.relative_to(ROOT)} reads like a work log (issue numbers, sessions): {hits}"
