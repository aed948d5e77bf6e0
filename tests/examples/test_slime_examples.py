"""slime's own examples, read from a local mirror of THUDM/slime, import here unchanged: every
Python file of every example imports (with this checkout's `slime`), or stops only on the one outside
package the compatibility table names for it (skipped where the mirror is not on this machine)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path("/work/.mirror/THUDM+slime/repo")
sys.path.insert(0, str(ROOT / "scripts"))
from slime_compat_table import EXAMPLES  # noqa: E402  (a script beside the tests' own code)

# Run in a fresh interpreter: each example directory is put first on sys.path the way slime's
# launch scripts do (PYTHONPATH), and every module the example holds is imported.
_IMPORT_ALL = r"""
import importlib, json, sys
from pathlib import Path
root = Path(sys.argv[1])
out = {}
for d in sorted(p for p in (root / "examples").iterdir() if p.is_dir()):
    package = (d / "__init__.py").exists()  # slime imports those as examples.<name>.<module>
    sys.path[:0] = [str(d), str(root)]
    for f in sorted(d.rglob("*.py")):
        name = ".".join(f.relative_to(d).with_suffix("").parts)
        if name == "__init__":
            continue
        try:
            importlib.import_module(f"examples.{d.name}.{name}" if package else name)
            out[f"{d.name}/{name}"] = None
        except SystemExit:  # a command-line script that parses its arguments on import
            out[f"{d.name}/{name}"] = None
        except BaseException as e:  # the example's own problem, reported per module
            out[f"{d.name}/{name}"] = f"{type(e).__name__}: {e}"
    del sys.path[:2]
    for m in [m for m, mod in sys.modules.items() if str(getattr(mod, "__file__", "") or "").startswith(str(d))]:
        del sys.modules[m]
print(json.dumps(out))
"""
_MISSING = re.compile(r"No module named '([\w.]+)'|cannot import name '(\w+)' from '([\w.]+)'")


def _missing_module(error: str) -> str | None:
    """The dotted module an import error names, or None for any other error."""
    m = _MISSING.search(error)
    if not m or not error.startswith(("ModuleNotFoundError", "ImportError")):
        return None
    return m.group(1) or f"{m.group(3)}.{m.group(2)}"


@pytest.fixture(scope="module")
def slime_examples(tmp_path_factory) -> Path:
    if not MIRROR.exists():
        pytest.skip("no local mirror of THUDM/slime")
    dest = tmp_path_factory.mktemp("slime_examples")
    archive = subprocess.run(["git", "-C", str(MIRROR), "archive", "HEAD", "examples"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def test_every_example_module_imports_or_names_its_outside_package(slime_examples):
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, str(slime_examples)],
        cwd=slime_examples,  # never this checkout: its own examples/ package must not shadow slime's
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) > 20
    failed = {m: e for m, e in results.items() if e}
    for module, error in failed.items():
        missing = _missing_module(error)
        named = re.findall(r"`([\w.]+)`", EXAMPLES[module.split("/")[0]])
        assert missing and any(missing == n or missing.startswith(n + ".") for n in named), (module, error)
    assert not failed.keys() & {"search-r1/generate_with_search", "multi_agent/rollout_with_multi_agents"}
