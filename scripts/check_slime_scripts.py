"""Check that every slime launch script's command line parses here.

    python scripts/check_slime_scripts.py [SLIME] [--script PATH ...] [--dirs DIR ...] [--verbose]

SLIME is a slime checkout (a work tree) or a git mirror of THUDM/slime (default
/work/.mirror/THUDM+slime/repo; its HEAD is read with `git archive`). A launch script is a `.sh`
file under `scripts/` or `examples/` (`--dirs` to look elsewhere) whose text names `train.py` or
`train_async.py`, outside `scripts/models/` (the model-config blocks launch scripts `source`).
These are the scripts slime ships for its users; slime's tree has two more elsewhere
(`tests/test_gspo.sh`, a CI script, and `slime_plugins/rollout_buffer/rollout_buffer_example.sh`,
whose `--ref-micro-batch-size` slime's own parser no longer has).

Each script runs under bash in a copy of the tree, with everything that would act on the machine
replaced: `ray`, `python`/`python3`, `torchrun`, `pkill`, `kill`, `sleep`, `nvidia-smi`, `ssh`,
`wait`, `rm`, ... are shell functions (and, for a lookup through PATH, shims in front of a minimal
PATH) that do nothing, except that a `python3 .../train.py ARGS` -- directly or after
`ray job submit ... --` -- records ARGS (a `python3 -m sglang.launch_server ARGS`, a server a
script starts beside its run, is recorded apart: `recorded(work, "server")`). The script's own
logic (its `source` of a model block, arrays, variable defaults, `if`s on the GPU count) runs as
written, with three allowances: a model block is found in this tree's scripts/models/ wherever
the script looks for it (/root/slime/...), the variables scripts demand from the environment are
set (`ENV_DEFAULTS`), and `set -e`/`-u`/`pipefail` do not stop a script before its launch. A launch command broken by a missing line
continuation is repaired (`repair`) and the repair is reported.

Each recorded command line is then given to slime-rl's parser in this process. Parsing only: a
checkpoint under /root that is not on this machine is not an error here, and what slime-rl's
cross-argument checks then refuse (an engine spanning nodes, ...) is reported after `ok`, not
counted as a failure. Prints one line per script and a summary; exits 1 when any script fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SLIME = Path("/work/.mirror/THUDM+slime/repo")
ENTRY = re.compile(r"\btrain(_async)?\.py\b")
MODEL_BLOCKS = "scripts/models/"
LAUNCH_DIRS = ("scripts", "examples")
# A line that goes on with a launch command's arguments: `${X_ARGS[@]}`, `"${X_ARGS[@]}"` or `--option`.
CONTINUATION = re.compile(r'^("?\$\{\w+\[@\]\}"?|--[\w-]+)')

# Commands a launch script runs for their effect on the machine (processes, GPUs, the network,
# files): all become no-ops. `pgrep` answers "no such process" so that wait-until-gone loops end.
NO_OPS = (
    "pkill killall kill sleep nvidia-smi rocm-smi ssh scp rsync wait pip pip3 uv hf huggingface-cli "
    "modelscope wget curl git rm mv cp mkdir ln touch chmod chown docker apt apt-get "
    "ibstat ibv_devinfo ip ifconfig hostname nproc"
).split()
# Launchers whose command line may carry train.py.
LAUNCHERS = ("python", "python3", "ray", "torchrun", "deepspeed", "accelerate")

PRELUDE = r"""
__slime_launch() {
    local seen=0 entry= out=() a kind=launch
    for a in "$@"; do
        if [ "$seen" = 1 ]; then out+=("$a"); continue; fi
        case "$a" in
            */train.py|train.py|*/train_async.py|train_async.py) seen=1; entry="$a";;
            sglang.launch_server) seen=1; entry="$a"; kind=server;;
        esac
    done
    [ "$seen" = 1 ] || return 0
    printf '%s\0' "$entry" "${out[@]}" > "$(command mktemp "$SLIME_CAPTURE_DIR/$kind.XXXXXX")"
}
# A model block is sourced from where the script expects slime (/root/slime, or a relative path
# some scripts get wrong): it is this tree's scripts/models/ file of the same name.
source() {
    local f="$1"
    shift
    if [ ! -f "$f" ]; then
        case "$f" in */models/*.sh) f="$SLIME_TREE/scripts/models/${f##*/}" ;; esac
    fi
    builtin source "$f" "$@"
}
# A failing probe of the machine (`pip list | grep megatron-core` under pipefail, a `cd` into
# /root) must not end the script before its launch line: -e, -u and pipefail are not turned on.
set() {
    builtin set "$@"
    builtin set +e +u +o pipefail
}
cd() { builtin cd "$@" 2>/dev/null || true; }
pgrep() { return 1; }
nohup() { "$@"; }
sudo() { "$@"; }
timeout() { shift; "$@"; }
"""
# Variables scripts require from the environment (they exit when unset), as a user would set them.
ENV_DEFAULTS = {
    "MASTER_ADDR": "127.0.0.1",
    "BASE_FOLDER": "/root",
    "BASE_DIR": "/root",
    "WANDB_KEY": "wandb-key",
    "WANDB_API_KEY": "wandb-key",
}


@dataclasses.dataclass
class Result:
    script: str
    error: str | None  # why its command line does not parse
    refused: str | None  # why slime-rl's cross-argument checks stop it (after parsing)
    repairs: list[str]

    def line(self) -> str:
        if self.error is not None:
            return f"FAIL  {self.script}: {self.error}"
        notes = [f"repaired: {'; '.join(self.repairs)}"] if self.repairs else []
        if self.refused is not None:
            notes.append(f"then refused by slime-rl: {self.refused}")
        return f"ok    {self.script}" + (f"  ({'; '.join(notes)})" if notes else "")


def prelude() -> str:
    lines = [PRELUDE]
    lines += [f'{name}() {{ __slime_launch "$@"; }}' for name in LAUNCHERS]
    lines += [f"{name}() {{ return 0; }}" for name in NO_OPS]
    return "\n".join(lines) + "\n"


def materialize(source: Path, dest: Path) -> str:
    """Copy slime's tree to `dest`; returns the commit (or "work tree" for a checkout)."""
    if (source / "scripts").is_dir() and (source / "train.py").is_file():
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True)
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True)
        return head.stdout.strip() + " (work tree)" if head.returncode == 0 else "work tree"
    commit = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    tar = subprocess.run(["git", "-C", str(source), "archive", commit], capture_output=True, check=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return commit


def launch_scripts(tree: Path, dirs: tuple[str, ...] = LAUNCH_DIRS) -> list[Path]:
    """Every .sh file under `dirs` naming train.py / train_async.py, model-config blocks excepted."""
    out = []
    for top in dirs:
        for path in sorted((tree / top).rglob("*.sh")):
            rel = path.relative_to(tree).as_posix()
            if not rel.startswith(MODEL_BLOCKS) and ENTRY.search(path.read_text(encoding="utf-8", errors="replace")):
                out.append(path)
    return out


def repair(text: str) -> tuple[str, list[str]]:
    r"""The launch command with a continuation backslash restored where a line of it lacks one but
    the next line goes on with its arguments (`${MODEL_ARGS[@]} \`): as written, bash would end the
    command there and run the rest as a command of its own. Returns (text, what was repaired)."""
    lines, notes = text.split("\n"), []
    start = next((i for i, line in enumerate(lines) if ENTRY.search(line) and not line.lstrip().startswith("#")), None)
    if start is None:
        return text, notes
    i = start
    while i + 1 < len(lines):
        line, following = lines[i].rstrip(), lines[i + 1].strip()
        if not line.endswith("\\"):
            if not CONTINUATION.match(following):
                break
            lines[i] = line + " \\"
            notes.append(f"added the missing '\\' at the end of line {i + 1}")
        i += 1
    return "\n".join(lines), notes


def capture(tree: Path, script: Path, work: Path, timeout: float = 60) -> tuple[list[list[str]], list[str], str]:
    """Run `script` with the stand-ins; returns (the argv of each train.py launch, repairs made to
    the script, the tail of bash's output)."""
    shims, captures, home = work / "bin", work / "captures", work / "home"
    for d in (shims, captures, home):
        d.mkdir(parents=True, exist_ok=True)
    env_file = work / "prelude.sh"
    env_file.write_text(prelude())
    for name in (*LAUNCHERS, *NO_OPS, "pgrep"):
        # A command found through PATH (`$(which python3)`, `env python3`) reaches the same function.
        shim = shims / name
        shim.write_text('#!/bin/bash\n"${0##*/}" "$@"\n')
        shim.chmod(0o755)
    text, repairs = repair(script.read_text(encoding="utf-8", errors="replace"))
    runnable = script.with_name(f".checked-{script.name}")  # same directory: BASH_SOURCE-relative paths hold
    runnable.write_text(text, encoding="utf-8")
    env = {
        **ENV_DEFAULTS,
        "PATH": f"{shims}:/usr/bin:/bin",
        "HOME": str(home),
        "BASH_ENV": str(env_file),
        "SLIME_CAPTURE_DIR": str(captures),
        "SLIME_TREE": str(tree),
        "LANG": "C.UTF-8",
    }
    try:
        proc = subprocess.run(
            ["bash", str(runnable)],
            cwd=tree,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        tail = f"bash exit {proc.returncode}: " + " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    except subprocess.TimeoutExpired:
        tail = f"bash did not finish within {timeout:.0f}s"
    finally:
        runnable.unlink()
    return [entry_args[1:] for entry_args in recorded(work, "launch")], repairs, tail


def recorded(work: Path, kind: str = "launch") -> list[list[str]]:
    """The command lines `capture` recorded in `work`, in launch order: "launch" for train.py /
    train_async.py, "server" for `python -m sglang.launch_server` (a teacher or judge server a
    script starts beside the run), each as [entry, its arguments...]."""
    out = []
    for record in sorted((work / "captures").glob(f"{kind}.*"), key=lambda p: p.stat().st_mtime_ns):
        fields = record.read_bytes().decode("utf-8", errors="replace").split("\0")
        out.append(fields[:-1])  # the entry, then its arguments (NUL-terminated)
    return out


def check_argv(argv: list[str], tree: Path) -> tuple[str | None, str | None]:
    """(why parsing fails, why slime-rl's cross-argument checks then stop the run); None where not.

    Parsing is every option known and every value well-formed (`parse_args` without its
    `check_given` and `finalize_args`); those checks refuse what this backend cannot run (an engine
    spanning nodes, prefill/decode disaggregation, ...) -- reported, but not a parse failure. Run
    from slime's tree, as the scripts are: relative paths in them are relative to it."""
    from slime.arguments import parser, upstream

    sink = io.StringIO()
    not_yet = mock.patch.object(upstream, "check_given", lambda given: None)
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), contextlib.chdir(tree):
        try:
            with not_yet, mock.patch.object(parser, "finalize_args", lambda args: args):
                args = parser.parse_args(argv)
        except SystemExit as exc:  # argparse's own exit (parse_args raises SlimeError instead)
            return f"exit {exc.code}: {sink.getvalue().strip().splitlines()[-1:]}", None
        except Exception as exc:  # noqa: BLE001  (every failure is reported per script, not raised)
            return f"{type(exc).__name__}: {exc}", None
        try:
            upstream.check_given(args.slime_options_given)
            parser.finalize_args(args)
        except Exception as exc:  # noqa: BLE001
            return None, f"{type(exc).__name__}: {exc}"
    return None, None


def check_tree(tree: Path, scripts: list[Path], verbose: bool = False) -> list[Result]:
    """One Result per script, printing one line each."""
    results = []
    with tempfile.TemporaryDirectory(prefix="slime-script-") as tmp:
        for i, script in enumerate(scripts):
            rel = script.relative_to(tree).as_posix()
            launches, repairs, tail = capture(tree, script, Path(tmp) / str(i))
            if not launches:
                result = Result(rel, f"no train.py launch captured ({tail})", None, repairs)
            else:
                outcomes = [check_argv(argv, tree) for argv in launches]
                error = next((e for e, _ in outcomes if e), None)
                refused = next((r for _, r in outcomes if r), None)
                result = Result(rel, error, refused, repairs)
            results.append(result)
            print(result.line(), flush=True)
            if verbose:
                for argv in launches:
                    print("      " + " ".join(argv))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("slime", nargs="?", type=Path, default=DEFAULT_SLIME, help="slime checkout or git mirror")
    p.add_argument("--script", action="append", default=[], help="check only these (paths in slime's tree)")
    p.add_argument("--dirs", nargs="+", default=list(LAUNCH_DIRS), help="where to look for launch scripts")
    p.add_argument("--verbose", action="store_true", help="also print each captured command line")
    args = p.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="slime-tree-") as tmp:
        tree = Path(tmp)
        commit = materialize(args.slime, tree)
        scripts = [tree / s for s in args.script] or launch_scripts(tree, tuple(args.dirs))
        results = check_tree(tree, scripts, args.verbose)
    parsed = [r for r in results if r.error is None]
    refused = [r for r in parsed if r.refused is not None]
    print(
        f"{len(parsed)} of {len(results)} slime launch scripts parse (slime {commit}); "
        f"{len(refused)} of them are then refused by slime-rl's cross-argument checks"
    )
    return 0 if len(parsed) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
