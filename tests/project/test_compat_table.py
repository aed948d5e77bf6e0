"""docs/slime-compat-table.md is what `scripts/slime_compat_table.py render` writes for this checkout
(so it cannot go stale), and it is read from the same slime commit as the parser's option data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slime_compat_table.py"


def test_the_committed_table_is_a_fresh_render():
    done = subprocess.run([sys.executable, str(SCRIPT), "render", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, (
        "docs/slime-compat-table.md is stale: run `python scripts/slime_compat_table.py render`\n" + done.stderr
    )


def test_the_surface_and_the_option_data_come_from_one_slime_commit():
    surface = json.loads((ROOT / "scripts" / "slime_surface.json").read_text())
    options = json.loads((ROOT / "slime" / "arguments" / "slime_upstream.json").read_text())
    assert surface["source"]["commit"] == options["source"]["commit"]
    assert len(surface["modules"]) > 100 and "slime.rollout.sglang_rollout" in surface["modules"]


def test_every_slime_module_path_is_here_or_has_a_reason():
    table = (ROOT / "docs" / "slime-compat-table.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| `slime")]
    assert rows and not [r for r in rows if "| missing |" in r]
    assert all(r.split("|")[3].strip() for r in rows if "| not used |" in r)  # a reason on every one
