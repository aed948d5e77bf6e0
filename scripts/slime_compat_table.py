"""The compatibility table: every slime module path, option group and example, with what it does here.

    # once per slime commit: read slime's source (nothing of it runs) into scripts/slime_surface.json
    python scripts/slime_compat_table.py extract /work/.mirror/THUDM+slime/repo
    # after any change here: write docs/slime-compat-table.md from that file and this checkout
    python scripts/slime_compat_table.py render

`extract` reads slime's tree with `git show` and `ast` only: each module's public functions and
classes, each example's `slime.*` imports. `render` imports each module path here and compares
names, so the table says what this checkout has, and `tests/project/test_compat_table.py` fails
when the committed table differs from a fresh render: it cannot go stale.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SURFACE = Path(__file__).with_name("slime_surface.json")
TABLE = ROOT / "docs" / "slime-compat-table.md"

_MEGATRON = (
    "the internals of slime's Megatron training backend; `--train-backend megatron` here runs on megatron-core with "
    "modules of its own under the same package (see docs/megatron.md), not these functions"
)
_SGLANG = "slime's in-process control of SGLang; engines here are separate servers started by `slime.ray.engine_launch`"
_GPU = "GPU-only"

# Module paths this backend has no use for, by prefix (the longest prefix wins), with why.
NOT_USED: dict[str, str] = {
    "slime.backends.megatron_utils": _MEGATRON,
    "slime.backends.sglang_utils": _SGLANG,
    "slime.utils.accelerator.cuda": _GPU,
    "slime.utils.accelerator.musa": "Moore Threads GPUs only",
    "slime.utils.accelerator.torch_accelerator": "GPU device selection; the accelerator here is `slime.utils.accelerator`",
    "slime.utils.accelerator.base": "the base class of slime's GPU accelerators",
    "slime.utils.rocm_checkpoint_writer": "ROCm GPUs only",
    "slime.utils.routing_replay": "MoE routing replay is a Megatron training feature",
    "slime.utils.reloadable_process_group": "NCCL process groups that survive GPU memory release",
    "slime.utils.tensor_backper": "Megatron weight backups for colocated GPU memory; FSDP here keeps its own state",
    "slime.utils.dp_schedule": "Megatron's data-parallel micro-batch schedule",
    "slime.utils.flops_utils": "Megatron model FLOPs for GPU throughput logging",
    "slime.utils.distributed_utils": "Megatron process groups; the trainer here sets up torch.distributed itself",
    "slime.utils.disk_delta": "slime's delta weight files; delta sync here is `slime.engine.weight_delta`",
    "slime.utils.health_monitor": "engine health here is watched by `slime.ray.engine_watcher`",
    "slime.utils.memory_utils": "GPU memory helpers",
    "slime.ray.actor_group": "slime's Megatron actor group; the trainer group here is `slime.ray.train_group`",
    "slime.ray.train_actor": "slime's Megatron train actor; the trainer actor here is `slime.backends.torch.actor`",
    "slime.ray.ray_actor": "slime's Megatron actor base class",
    "slime.ray.utils": "GPU visibility helpers for Ray actors",
    "slime.ray.rollout_validation": "GPU index checks of SGLang server groups",
    "slime.rollout._fanout_test_helpers": "slime's own test helper",
    "slime.agent.harness": "coding-agent harnesses that drive Claude Code / Codex inside an E2B cloud sandbox",
    "slime.agent.sandbox": "the E2B cloud sandbox client (a web API); the local sandbox here is `slime.sandbox`",
}

# slime's examples: what each needs from outside this checkout ("" when nothing). Packages and
# slime modules in backticks are the ones its Python files may fail to import here
# (tests/examples/test_slime_examples.py imports every file of every example).
EXAMPLES: dict[str, str] = {
    "coding_agent_rl": "an E2B cloud sandbox (a web API, driven by slime's `slime.agent.sandbox` and "
    "`slime.agent.harness`) and a 35B MoE model on 8 GPU nodes",
    "delta_weight_sync": "a 30B MoE model on GPUs (the delta sync itself runs here: `--update-weight-mode delta`)",
    "eval_multi_task": "the IFBench instruction data sets (and NLTK's data files for the IFBench checks that "
    "split sentences or words)",
    "fully_async": "",
    "geo3k_vlm": "multimodal prompts (images): text models only here",
    "geo3k_vlm_multi_turn": "multimodal prompts (images, encoded by slime's "
    "`slime.utils.processing_utils.encode_image_for_rollout_engine`): text models only here",
    "multi_agent": "",
    "on_policy_distillation": "",
    "retool": "`datasets` and the Hugging Face Hub for its data preparation scripts",
    "search-r1": "a search server: its dense retriever needs `datasets`, `faiss` and a Wikipedia index, "
    "its Google search `chardet` and Google's web API; its local retrieval client reads this repository's "
    "examples/search_r1 server",
    "strands_sglang": "the `strands` agents package (`strands-agents`)",
    "tau-bench": "the `tau_bench` package, `sglang`'s tool parsers and an OpenAI-compatible user simulator (a web API)",
    "train_infer_mismatch_helper": "",
}


# The examples whose own code (read from a copy of slime's repository) a test runs here.
RUN_BY = {
    "search-r1": "tests/examples/test_slime_search_r1.py",
    "retool": "tests/examples/test_slime_retool.py",
    "train_infer_mismatch_helper": "tests/examples/test_slime_train_infer_mismatch.py",
    "multi_agent": "tests/examples/test_slime_multi_agent.py",
    # launch scripts only: the scripts themselves run (their train_async.py / train.py, the teacher server)
    "fully_async": "tests/examples/test_slime_launch_scripts_run.py",
    "on_policy_distillation": "tests/examples/test_slime_launch_scripts_run.py",
}


# ---------------------------------------------------------------------------------------- extract
def _git(repo: Path, *cmd: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *cmd], check=True, capture_output=True, text=True).stdout


def _module_name(path: str) -> str:
    name = path.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _public_names(source: str) -> list[str]:
    """Top-level functions and classes not starting with `_` (what a hook module can import)."""
    tree = ast.parse(source)
    names = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    }
    return sorted(names)


def _slime_imports(source: str) -> list[str]:
    """`module` or `module:name` for every `slime.*` import of an example file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "slime"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "slime":
            found |= {f"{node.module}:{a.name}" for a in node.names}
    return sorted(found)


def extract(repo: Path) -> dict:
    commit = _git(repo, "rev-parse", "HEAD").strip()
    files = _git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
    modules = {
        _module_name(f): _public_names(_git(repo, "show", f"HEAD:{f}"))
        for f in files
        if f.startswith("slime/") and f.endswith(".py")
    }
    examples: dict[str, set[str]] = {}
    for f in files:
        parts = f.split("/")
        if parts[0] != "examples" or len(parts) < 3:
            continue
        imports = examples.setdefault(parts[1], set())
        if f.endswith(".py"):
            imports |= set(_slime_imports(_git(repo, "show", f"HEAD:{f}")))
    return {
        "source": {"repo": "THUDM/slime", "commit": commit},
        "modules": modules,
        "examples": {name: sorted(imports) for name, imports in examples.items()},
    }


# ----------------------------------------------------------------------------------------- render
def _not_used(module: str) -> str | None:
    hits = [p for p in NOT_USED if module == p or module.startswith(p + ".")]
    return NOT_USED[max(hits, key=len)] if hits else None


def _module_status(module: str, names: list[str]) -> tuple[str, str]:
    """("works" | "partial" | "not used" | "missing", detail)."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        if _not_used(module):
            return "not used", _not_used(module) or ""
        return "missing", f"`{e}`"
    absent = [n for n in names if not hasattr(mod, n)]
    if not absent:
        return "works", ""
    if _not_used(module):
        return "not used", _not_used(module) or ""
    return "partial", "lacks " + ", ".join(f"`{n}`" for n in absent)


def _import_works(spec: str) -> bool:
    module, _, name = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    if not name or hasattr(mod, name):
        return True
    try:  # `from package import submodule`
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


def _options_rows() -> list[str]:
    from slime.arguments import upstream

    rows = ["| slime option group | options | work here | accepted, not used | refused |", "|---|---|---|---|---|"]
    groups: dict[str, Counter] = {}
    for name, spec in sorted(upstream.slime_options().items()):
        # Every slime option is defined by slime-rl's own groups or sits in one of upstream's tables.
        kind = "refused" if name in upstream.NOT_SUPPORTED else "not used" if name in upstream.NOT_USED else "works"
        groups.setdefault(spec["group"], Counter())[kind] += 1
    for group, c in sorted(groups.items()):
        rows.append(f"| `{group}` | {sum(c.values())} | {c['works']} | {c['not used']} | {c['refused']} |")
    return rows


def render(surface: dict) -> str:
    src = surface["source"]
    lines = [
        "# slime compatibility table",
        "",
        f"Generated by `scripts/slime_compat_table.py` from slime {src['commit'][:9]} ({src['repo']}) and",
        "this checkout; `tests/project/test_compat_table.py` fails when it is stale. How each piece",
        "behaves is in [Coming from slime](slime-compat.md).",
        "",
        "## Module paths",
        "",
        "*works*: the module imports here with every public function and class of slime's; *partial*:",
        "it imports, the names listed are not here; *not used*: it has no job on this backend (why).",
        "",
        "| module | status | detail |",
        "|---|---|---|",
    ]
    tally: Counter = Counter()
    for module, names in sorted(surface["modules"].items()):
        status, detail = _module_status(module, names)
        tally[status] += 1
        lines.append(f"| `{module}` | {status} | {detail} |")
    lines[10:10] = [", ".join(f"{n} {s}" for s, n in sorted(tally.items())) + f" of {sum(tally.values())}.", ""]
    lines += ["", "## Options", "", *_options_rows(), "", "## Examples", ""]
    lines += [
        "Every Python file of every example imports here, or stops only on the outside package named",
        "(`tests/examples/test_slime_examples.py`, where a copy of slime's repository is at hand).",
        "",
        "| example | slime imports that resolve here | needs from outside |",
        "|---|---|---|",
    ]
    for example, imports in sorted(surface["examples"].items()):
        ok = sum(_import_works(i) for i in imports)
        missing = [i for i in imports if not _import_works(i)]
        cell = f"{ok} of {len(imports)}" + (" (not: " + ", ".join(f"`{m}`" for m in missing) + ")" if missing else "")
        ran = f"; runs here unchanged (`{RUN_BY[example]}`)" if example in RUN_BY else ""
        lines.append(f"| `{example}` | {cell} | {EXAMPLES.get(example, '?') or 'nothing'}{ran} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(ROOT))  # this checkout's `slime`, also when run as a script
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("extract").add_argument("repo", type=Path)
    sub.add_parser("render").add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    a = p.parse_args(argv)
    if a.cmd == "extract":
        SURFACE.write_text(json.dumps(extract(a.repo), indent=1, sort_keys=True) + "\n")
        return
    text = render(json.loads(SURFACE.read_text()))
    if a.check:
        sys.exit(0 if TABLE.exists() and TABLE.read_text() == text else 1)
    TABLE.write_text(text)


if __name__ == "__main__":
    main()
