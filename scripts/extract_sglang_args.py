"""Write slime/arguments/sglang_server_args.json: every option SGLang's server parser knows, as data.

    python scripts/extract_sglang_args.py /path/to/sglang/python/sglang/srt/server_args.py \
        [--argparse-actions .../sglang/srt/arg_groups/argparse_actions.py] \
        [--fields-file .../sglang/srt/arg_groups/fields/*.py] \
        [--commit SHA] [-o slime/arguments/sglang_server_args.json]

slime forwards every `--sglang-<name> [values]` to SGLang's server (`ServerArgs.add_cli_args`, each
flag prefixed with `--sglang-`). To split such options off the command line correctly without SGLang
installed (it is a GPU package), slime-rl needs each option's name, its aliases, its dest and how
many values it takes: none (a flag), exactly one, or several (`nargs` `?`/`*`/`+`/N).

SGLang is never imported: the file is read with `ast`. Two sources of options are understood:

* the `ServerArgs` dataclass fields annotated `A[T, "help"]` / `A[T, Arg(...)]`, registered by
  `sglang.srt.arg_groups.arg_utils.add_cli_args_from_dataclass`. That function is reproduced here as
  rules, not code: the flag is `Arg.cli_name` or `--` + the field name with `_` -> `-`, `Arg.aliases`
  are extra names, the dest is always the field name; a field without an `Arg`/string element (e.g.
  `A[Optional[str], NS("serving")]`) or with `Arg(no_cli=True)` is not registered; `Arg.action` wins
  (then only `action_kwargs` can set nargs); else `Literal[...]` takes one value (or `Arg.nargs`),
  `List[X]` without a `type_parser` takes `Arg.nargs or "+"`, `bool` is `store_true`, anything else
  takes one value (or `Arg.nargs`). `Optional[X]` is unwrapped first; a Union of several non-None
  types is not.
* the `parser.add_argument(...)` calls in `ServerArgs.add_cli_args` (dynamic choices, `--config`,
  deprecated aliases), with argparse's own rules for actions, nargs and dest. SGLang's custom actions
  (`DeprecatedAction`, `DeprecatedStoreTrueAction`, ... in `arg_groups/argparse_actions.py`) take the
  `nargs` default of their `__init__`; pass `--argparse-actions` to read them from the file, else
  the table below (read from that file at the commit noted there) is used.

Newer SGLang releases (0.5.19+) moved the fields into namespace classes under
`sglang/srt/arg_groups/fields/*.py`; pass those files with `--fields-file` and every class that
defines `_NS_PATH` there contributes its annotated fields as well.

The shipped JSON was made from sgl-project/sglang commit 001067fffe33427bee0ed2f007fb7551a1d76b44
(python/sglang/srt/server_args.py, 486,489 characters; `argparse_actions.py` identical at
1b3fb4c68362f076a4e77d40ee959a9c11fd6b52; `arg_utils.py` rules checked at
0116c6066d6ead4b97c0468f65e04cad47ca021e). That file was read page by page from a stored copy of the
repository; the pages holding the module header, every `ServerArgs` field and `add_cli_args` were
each checked to the character count, and their field block and `add_cli_args` compared with the
same file in the sglang 0.5.18 release (`add_cli_args` is identical; the field blocks differ only by
fields and help texts added since). The resulting options are what `ServerArgs.add_cli_args` adds.

slime runs SGLang with its own patches (docker/patch/<version>/sglang*.patch), some of which add
server options slime's scripts and docs use (`--sglang-custom-pull-weights-pre-read-hook`, ...).
`--slime SLIME_CHECKOUT` also reads the `+` side of every such patch's `server_args.py` hunks (the
same two sources: annotated fields and `add_argument` calls) and adds the options SGLang's own file
lacks, each with "patches": the patch files adding it. Without a server_args.py, `--slime` updates
only those options of an existing output file.

Output: {"source": {...}, "count": N, "options": {"--flag": {"dest", "nargs", "flag", "aliases",
"action", "origin", "declared_dest"}}, "aliases": {"--alias": "--flag"}, "undetermined": [...]}.
`nargs` is argparse's: null = exactly one value, 0 = none (then "flag" is true), "?", "*", "+" or an
int. "undetermined" lists options whose value shape could not be read from the source (the shape
chosen for them is one value) -- empty for the shipped file.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = "sgl-project/sglang"
DEFAULT_PATH = "python/sglang/srt/server_args.py"
DEFAULT_COMMIT = "001067fffe33427bee0ed2f007fb7551a1d76b44"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "slime" / "arguments" / "sglang_server_args.json"

# argparse's built-in actions that take no value on the command line.
NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}
VALUE_ACTIONS = {"store", "append", "extend"}

# SGLang's custom actions (arg_groups/argparse_actions.py at 1b3fb4c68362f076a4e77d40ee959a9c11fd6b52):
# the nargs their __init__ uses when the caller gives none. None = argparse's default (one value).
KNOWN_CUSTOM_ACTIONS = {
    "DeprecatedAction": 0,
    "DeprecatedStoreTrueAction": 0,
    "DeprecatedStoreConstAction": 0,
    "DeprecatedAliasStoreAction": None,
    "LoRAPathAction": None,
}

_MISSING = object()


class Undetermined(Exception):
    pass


# --------------------------------------------------------------------------- AST helpers


def _name(node) -> str | None:
    """`Foo` or `mod.Foo` -> "Foo"; anything else -> None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _literal(node, default=_MISSING):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if default is _MISSING:
            raise Undetermined(ast.unparse(node)) from None
        return default


def _is_str_expr(node) -> bool:
    """True when the expression evaluates to a str: literal, f-string, or str concatenation."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_str_expr(node.left) or _is_str_expr(node.right)
    return False


def _subscript_parts(node) -> tuple[str | None, list]:
    """`X[a, b]` -> ("X", [a, b]); `X` -> ("X", [])."""
    if isinstance(node, ast.Subscript):
        sl = node.slice
        items = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
        return _name(node.value), items
    return _name(node), []


def _is_none(node) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or _name(node) == "NoneType"


def _union_members(node) -> list | None:
    """Members of `Union[...]` / `Optional[X]` / `X | Y`, flattened; None if not a union."""
    head, items = _subscript_parts(node)
    if isinstance(node, ast.Subscript) and head == "Optional":
        return _flatten_union(items[0]) + [ast.Constant(None)]
    if isinstance(node, ast.Subscript) and head == "Union":
        out = []
        for item in items:
            out.extend(_flatten_union(item))
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _flatten_union(node.left) + _flatten_union(node.right)
    return None


def _flatten_union(node) -> list:
    members = _union_members(node)
    return [node] if members is None else members


def _unwrap_optional(node):
    """Optional[X] / Union[X, None] / X | None with exactly one non-None member -> X."""
    members = _union_members(node)
    if members is None:
        return node
    non_none = [m for m in members if not _is_none(m)]
    return non_none[0] if len(non_none) == 1 else node


def _kwargs(call: ast.Call) -> dict:
    return {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}


# --------------------------------------------------------------------------- custom actions


def read_custom_actions(path: Path) -> dict[str, int | str | None]:
    """Classes deriving from an argparse Action: the default of their __init__'s `nargs` parameter."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: dict[str, int | str | None] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        default = None
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                args = item.args
                positional = args.posonlyargs + args.args
                defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
                pairs = list(zip(positional, defaults, strict=True)) + list(
                    zip(args.kwonlyargs, args.kw_defaults, strict=True)
                )
                for arg, value in pairs:
                    if arg.arg == "nargs" and value is not None:
                        default = _literal(value)
        out[node.name] = default
    return out


# --------------------------------------------------------------------------- shapes


def _action_shape(action_node, nargs_node, custom_actions, note) -> tuple[str | None, object, list]:
    """(action name, nargs, extra option-string transforms) for an explicit `action=`."""
    if isinstance(action_node, ast.Constant) and isinstance(action_node.value, str):
        action = action_node.value
        if action in NO_VALUE_ACTIONS:
            return action, 0, []
        if action in VALUE_ACTIONS:
            return action, _nargs(nargs_node), []
        note(f"unknown action string {action!r}")
        return action, _nargs(nargs_node), []
    action = _name(action_node)
    if action == "BooleanOptionalAction":
        return action, 0, ["no-"]
    if action in custom_actions:
        default = custom_actions[action]
        return action, (_nargs(nargs_node) if nargs_node is not None else default), []
    note(f"action {ast.unparse(action_node)} is not known")
    return action, _nargs(nargs_node), []


def _nargs(node):
    if node is None:
        return None
    value = _literal(node)
    if value is not None and not isinstance(value, (int, str)):
        raise Undetermined(ast.unparse(node))
    return value


def field_shape(type_node, arg: dict, custom_actions, note) -> tuple[str | None, object, list]:
    """The argparse action and nargs `add_cli_args_from_dataclass` gives a field."""
    if "action" in arg and not _is_none(arg["action"]):
        nargs_node = None
        extra = arg.get("action_kwargs")
        if extra is not None and not _is_none(extra):
            if not isinstance(extra, ast.Dict):
                raise Undetermined(f"action_kwargs={ast.unparse(extra)}")
            for key, value in zip(extra.keys, extra.values, strict=True):
                if key is not None and _literal(key, None) == "nargs":
                    nargs_node = value
        return _action_shape(arg["action"], nargs_node, custom_actions, note)
    arg_nargs = arg.get("nargs")
    has_type_parser = "type_parser" in arg and not _is_none(arg["type_parser"])
    inner = _unwrap_optional(type_node)
    head, _ = _subscript_parts(inner)
    if isinstance(inner, ast.Subscript) and head == "Literal":
        return "store", _nargs(arg_nargs), []
    if isinstance(inner, ast.Subscript) and head in ("List", "list") and not has_type_parser:
        return "store", _nargs(arg_nargs) or "+", []
    if not isinstance(inner, ast.Subscript) and head == "bool":
        return "store_true", 0, []
    return "store", (_nargs(arg_nargs) or None), []


# --------------------------------------------------------------------------- collection


class Collector:
    def __init__(self, custom_actions):
        self.custom_actions = custom_actions
        self.options: dict[str, dict] = {}
        self.aliases: dict[str, str] = {}
        self.undetermined: list[dict] = []
        self.skipped: list[str] = []

    def add(self, names: list[str], dest: str, action, nargs, extra_prefixes, origin, declared_dest):
        names = list(names)
        for prefix in extra_prefixes:  # BooleanOptionalAction: --x also gets --no-x
            names += ["--" + prefix + n[2:] for n in list(names) if n.startswith("--")]
        for n in names:
            if n in self.options or n in self.aliases:
                raise SystemExit(f"option {n} registered twice (argparse would refuse it)")
        primary = names[0]
        self.options[primary] = {
            "dest": dest,
            "nargs": nargs,
            "flag": nargs == 0,
            "aliases": names[1:],
            "action": action,
            "origin": origin,
            "declared_dest": declared_dest,
        }
        for alias in names[1:]:
            self.aliases[alias] = primary

    def field(self, stmt: ast.AnnAssign, where: str):
        if not isinstance(stmt.target, ast.Name):
            return
        field_name = stmt.target.id
        head, items = _subscript_parts(stmt.annotation)
        if not (isinstance(stmt.annotation, ast.Subscript) and head in ("A", "Annotated")) or len(items) < 2:
            self.skipped.append(f"{field_name} (no A[...] annotation)")
            return
        type_node, meta = items[0], items[1:]
        arg: dict | None = None
        for element in meta:
            if isinstance(element, ast.Call) and _name(element.func) == "Arg":
                arg = _kwargs(element)
                break
            if _is_str_expr(element):
                arg = {}
                break
        if arg is None:
            self.skipped.append(f"{field_name} (no Arg/help: registered by hand if at all)")
            return
        if "no_cli" in arg and _literal(arg["no_cli"], False) is True:
            self.skipped.append(f"{field_name} (no_cli)")
            return
        cli_name = "--" + field_name.replace("_", "-")
        declared = False
        if "cli_name" in arg and not _is_none(arg["cli_name"]):
            cli_name = _literal(arg["cli_name"])
            declared = cli_name.lstrip("-").replace("-", "_") != field_name
        aliases = []
        if "aliases" in arg and not _is_none(arg["aliases"]):
            aliases = list(_literal(arg["aliases"]))
        problems = []
        try:
            action, nargs, extra = field_shape(type_node, arg, self.custom_actions, problems.append)
        except Undetermined as exc:
            action, nargs, extra = None, None, []
            problems.append(f"could not read {exc}")
        if problems:
            self.undetermined.append(
                {"option": cli_name, "where": where, "why": "; ".join(problems), "chosen_nargs": nargs}
            )
        self.add([cli_name] + aliases, field_name, action, nargs, extra, "field", declared)

    def add_argument(self, call: ast.Call, where: str):
        names = []
        for a in call.args:
            value = _literal(a, None)
            if not isinstance(value, str):
                self.undetermined.append(
                    {
                        "option": ast.unparse(a),
                        "where": where,
                        "why": "option name is not a literal",
                        "chosen_nargs": None,
                    }
                )
                return
            names.append(value)
        if not names or not names[0].startswith("-"):
            return  # positional argument: not an option
        kw = _kwargs(call)
        declared = "dest" in kw
        if declared:
            dest = _literal(kw["dest"])
        else:
            long = [n for n in names if n.startswith("--")]
            dest = (long[0] if long else names[0]).lstrip("-").replace("-", "_")
        problems = []
        try:
            if "action" in kw:
                action, nargs, extra = _action_shape(
                    kw["action"], kw.get("nargs"), self.custom_actions, problems.append
                )
            else:
                action, nargs, extra = "store", _nargs(kw.get("nargs")), []
        except Undetermined as exc:
            action, nargs, extra = None, None, []
            problems.append(f"could not read {exc}")
        if problems:
            self.undetermined.append(
                {"option": names[0], "where": where, "why": "; ".join(problems), "chosen_nargs": nargs}
            )
        self.add(names, dest, action, nargs, extra, "add_argument", declared)


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def extract(server_args: Path, fields_files: list[Path], custom_actions: dict, class_name: str) -> Collector:
    tree = ast.parse(server_args.read_text(encoding="utf-8"))
    for node in tree.body:  # actions defined next to ServerArgs, if any
        if isinstance(node, ast.ClassDef) and any(_name(b) and _name(b).endswith("Action") for b in node.bases):
            custom_actions.setdefault(node.name, None)
    cls = _find_class(tree, class_name)
    if cls is None:
        raise SystemExit(f"no class {class_name} in {server_args}")
    col = Collector(custom_actions)

    # Dataclass fields: those of namespace classes (newer layout) first, then the class body's own.
    for path in fields_files:
        ftree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ftree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            if not any(isinstance(s, (ast.Assign, ast.AnnAssign)) and "_NS_PATH" in ast.unparse(s) for s in node.body):
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign):
                    col.field(stmt, f"{path.name}:{node.name}")
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign):
            col.field(stmt, class_name)

    method = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "add_cli_args"), None)
    if method is None:
        raise SystemExit(f"{class_name}.add_cli_args not found in {server_args}")
    for node in ast.walk(method):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            col.add_argument(node, f"{class_name}.add_cli_args")
    return col


# --------------------------------------------------------------------------- slime's patches

SLIME_PATCH_GLOBS = (
    "docker/patch/*/sglang*.patch",
    "docker/amd_patch/*/sglang*.patch",
    "docker/npu_patch/sglang*.patch",
)
_FIELD_START = re.compile(r"^[a-z_][a-z0-9_]*\s*:\s*(A|Annotated)\[")


def _added_blocks(patch_text: str, filename: str) -> list[list[str]]:
    """The runs of consecutive added lines in the hunks of files named `filename`, `+` stripped."""
    blocks: list[list[str]] = []
    current, run = "", None
    for line in patch_text.splitlines():
        if line.startswith("diff --git "):
            current, run = line.split()[-1], None
        elif line.startswith("+") and not line.startswith("+++") and current.endswith("/" + filename):
            if run is None:
                run = []
                blocks.append(run)
            run.append(line[1:])
        else:
            run = None
    return blocks


def collect_patch(patch: Path, name: str, custom_actions) -> Collector:
    """The options a patch's added server_args.py lines define: annotated fields, add_argument calls."""
    col = Collector(dict(custom_actions))
    for lines in _added_blocks(patch.read_text(encoding="utf-8", errors="replace"), "server_args.py"):
        for start, line in enumerate(lines):
            if not (_FIELD_START.match(line.strip()) or ".add_argument(" in line):
                continue
            for end in range(start + 1, len(lines) + 1):  # the shortest run of lines that is a statement
                try:
                    stmt = ast.parse(textwrap.dedent("\n".join(lines[start:end]))).body[0]
                except (SyntaxError, IndexError):
                    continue
                if isinstance(stmt, ast.AnnAssign):
                    col.field(stmt, name)
                for node in ast.walk(stmt):
                    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                        col.add_argument(node, name)
                break
    return col


def merge_patches(col: Collector, slime_root: Path, custom_actions) -> list[str]:
    """Add to `col` the options slime's SGLang patches define that SGLang's file does not (the same
    option from several patch versions once, naming them all). Returns the patch files read."""
    patches = sorted({p for pattern in SLIME_PATCH_GLOBS for p in slime_root.glob(pattern)})
    for patch in patches:
        rel = patch.relative_to(slime_root).as_posix()
        found = collect_patch(patch, rel, custom_actions)
        col.undetermined += found.undetermined
        for name, entry in found.options.items():
            known = col.options.get(name)
            if known is None and not any(a in col.options or a in col.aliases for a in entry["aliases"]):
                col.options[name] = {**entry, "patches": [rel]}
                col.aliases.update(dict.fromkeys(entry["aliases"], name))
            elif known is not None and "patches" in known:
                if (known["dest"], known["nargs"]) != (entry["dest"], entry["nargs"]):
                    raise SystemExit(f"{name} is defined differently by {rel} and {known['patches']}")
                known["patches"].append(rel)
    return [p.relative_to(slime_root).as_posix() for p in patches]


def _previous(out: Path) -> tuple[dict, Collector]:
    """An existing output file without its patch options: (its source block, its options)."""
    data = json.loads(out.read_text(encoding="utf-8"))
    col = Collector({})
    col.options = {k: v for k, v in data["options"].items() if "patches" not in v}
    col.aliases = {a: k for a, k in data["aliases"].items() if k in col.options}
    col.undetermined = data["undetermined"]
    return data["source"], col


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "server_args", type=Path, nargs="?", help="path of sglang/srt/server_args.py (omit: --slime updates -o)"
    )
    p.add_argument(
        "--argparse-actions",
        type=Path,
        default=None,
        help="path of sglang/srt/arg_groups/argparse_actions.py (default: built-in table)",
    )
    p.add_argument(
        "--fields-file",
        type=Path,
        nargs="*",
        default=[],
        help="sglang/srt/arg_groups/fields/*.py (SGLang 0.5.19+ layout)",
    )
    p.add_argument("--class-name", default="ServerArgs")
    p.add_argument("--repo", default=REPO)
    p.add_argument("--path", default=DEFAULT_PATH)
    p.add_argument("--commit", default=DEFAULT_COMMIT)
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--slime", type=Path, default=None, help="a slime checkout: add its SGLang patches' options")
    p.add_argument("--slime-commit", default=None, help="that checkout's commit (default: its HEAD)")
    args = p.parse_args(argv)

    custom = dict(KNOWN_CUSTOM_ACTIONS)
    if args.argparse_actions is not None:
        custom.update(read_custom_actions(args.argparse_actions))
    if args.server_args is None:
        if args.slime is None:
            p.error("give server_args.py, or --slime to update the patch options of --out")
        source, col = _previous(args.out)
    else:
        source = {"repo": args.repo, "path": args.path, "commit": args.commit}
        col = extract(args.server_args, sorted(args.fields_file), custom, args.class_name)
    source.pop("slime_patches", None)
    if args.slime is not None:
        commit = (
            args.slime_commit
            or subprocess.run(
                ["git", "-C", str(args.slime), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        files = merge_patches(col, args.slime.resolve(), custom)
        source["slime_patches"] = {"repo": "THUDM/slime", "commit": commit, "files": files}

    data = {
        "source": source,
        "count": len(col.options),
        "options": {k: col.options[k] for k in sorted(col.options)},
        "aliases": {k: col.aliases[k] for k in sorted(col.aliases)},
        "undetermined": col.undetermined,
    }
    args.out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    n_flags = sum(o["flag"] for o in col.options.values())
    n_multi = sum(o["nargs"] not in (0, None) for o in col.options.values())
    print(
        f"{len(col.options)} options ({n_flags} flags, {len(col.options) - n_flags - n_multi} one value, "
        f"{n_multi} other nargs), {len(col.aliases)} aliases, {len(col.undetermined)} undetermined "
        f"-> {args.out}"
    )
    for u in col.undetermined:
        print(
            f"  undetermined: {u['option']} ({u['where']}): {u['why']}; chose nargs={u['chosen_nargs']!r}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
