"""SGLang's server options as data (slime/arguments/sglang_server_args.json, written by
scripts/extract_sglang_args.py from SGLang's server_args.py): the shipped file is complete enough
to split `--sglang-<name> [values]` off a slime command line, and the extractor reads a
server_args.py the way `ServerArgs.add_cli_args` builds its parser."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "slime" / "arguments" / "sglang_server_args.json"
SCRIPT = ROOT / "scripts" / "extract_sglang_args.py"

ONE = None  # argparse's nargs for "exactly one value"

# Written out from SGLang's server_args.py (commit 001067ff), independently of the extractor:
# option -> (nargs, takes no value).
SANITY = {
    "--cuda-graph-bs": ("+", False),  # deprecated alias of --cuda-graph-bs-decode, type=int nargs="+"
    "--cuda-graph-bs-decode": ("+", False),  # Optional[List[int]] field
    "--enable-dp-attention": (0, True),
    "--ep-size": (ONE, False),
    "--mem-fraction-static": (ONE, False),
    "--speculative-algorithm": (ONE, False),
    "--tp-size": (ONE, False),
    "--model-path": (ONE, False),
    "--log-level": (ONE, False),
    "--context-length": (ONE, False),
    "--chunked-prefill-size": (ONE, False),
    "--max-running-requests": (ONE, False),
    "--enable-memory-saver": (0, True),
    "--model-checksum": ("?", False),  # nargs="?", const=""
    "--lora-paths": ("*", False),  # LoRAPathAction with action_kwargs nargs="*"
    "--uvicorn-access-log-exclude-prefixes": ("*", False),
    "--lora-target-modules": ("*", False),  # Union[set, List] is not a list: Arg.nargs="*"
    "--sidecar-args": (ONE, False),  # List[str] but with a type_parser: one JSON value
    "--decoupled-spec-role": (ONE, False),  # Literal[...]
    "--enable-lora": (0, True),  # Optional[bool]
    "--dllm-fdfo": (0, True),  # BooleanOptionalAction
    "--config": (ONE, False),  # added by hand in add_cli_args
    "--reasoning-parser": (ONE, False),  # dynamic choices, added by hand
    "--stream-output": (0, True),  # DeprecatedStoreTrueAction
    "--enable-expert-distribution-metrics": (0, True),  # DeprecatedAction, nargs=0 by default
    "--nsa-prefill-backend": (ONE, False),  # DeprecatedAliasStoreAction
}
ALIASES = {
    "--ep": "--ep-size",
    "--expert-parallel-size": "--ep-size",
    "--tensor-parallel-size": "--tp-size",
    "--model": "--model-path",
    "--no-dllm-fdfo": "--dllm-fdfo",
    "--nccl-init-addr": "--dist-init-addr",
}
# Fields SGLang registers by hand, or not at all (no `Arg`/help in the annotation or no_cli=True).
NOT_OPTIONS = {
    "--custom-sigquit-handler",
    "--stat-loggers",
    "--uses-mamba-radix-cache",
    "---speculative-draft-quantization-explicitly-set",
}


@pytest.fixture(scope="module")
def data():
    return json.loads(DATA.read_text(encoding="utf-8"))


def _flag_dest(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def test_source_block_names_the_sglang_file_and_commit(data):
    src = data["source"]
    assert src["repo"] == "sgl-project/sglang"
    assert src["path"] == "python/sglang/srt/server_args.py"
    assert re.fullmatch(r"[0-9a-f]{40}", src["commit"])
    assert src["commit"] in SCRIPT.read_text(encoding="utf-8")  # the script's docstring names it


def test_several_hundred_options_sorted_and_counted(data):
    options = data["options"]
    assert data["count"] == len(options)
    assert len(options) > 400
    assert list(options) == sorted(options)
    assert data["undetermined"] == []
    flags = sum(o["flag"] for o in options.values())
    assert 100 < flags < len(options) - 200  # both kinds, many of each


@pytest.mark.parametrize("name", sorted(SANITY))
def test_sanity_options_have_their_value_shape(data, name):
    nargs, flag = SANITY[name]
    entry = data["options"][name]
    assert entry["nargs"] == nargs
    assert entry["flag"] is flag


def test_aliases_resolve_to_their_primary(data):
    for alias, primary in ALIASES.items():
        assert data["aliases"][alias] == primary
        assert alias in data["options"][primary]["aliases"]
        assert alias not in data["options"]
    for primary, entry in data["options"].items():
        for alias in entry["aliases"]:
            assert data["aliases"][alias] == primary
    assert set(data["aliases"]) == {a for e in data["options"].values() for a in e["aliases"]}


def test_fields_without_a_cli_surface_are_not_options(data):
    assert not NOT_OPTIONS & set(data["options"])
    assert "--disable-cuda-graph" in data["options"]  # no_cli field, but a deprecated flag by hand
    assert data["options"]["--disable-cuda-graph"]["origin"] == "add_argument"


def test_every_entry_is_well_formed_and_its_dest_follows_the_flag_or_is_declared(data):
    options = data["options"]
    dests = {o["dest"] for o in options.values()}
    for name, entry in options.items():
        assert re.fullmatch(r"--[a-z0-9][a-z0-9-]*", name), name
        assert set(entry) >= {"dest", "nargs", "flag", "aliases", "action", "origin", "declared_dest"}
        assert entry["nargs"] in (None, 0, "?", "*", "+") or (isinstance(entry["nargs"], int) and entry["nargs"] > 0)
        assert entry["flag"] is (entry["nargs"] == 0), name
        assert entry["origin"] in ("field", "add_argument")
        assert entry["dest"].isidentifier(), name
        if entry["dest"] != _flag_dest(name):
            assert entry["declared_dest"], name
            # a field's own name (cli_name differs), or the dest of the option it is a deprecated alias of
            others = {o["dest"] for n, o in options.items() if n != name}
            assert entry["origin"] == "field" or entry["dest"] in others, name
    assert options["--fp8-gemm-backend"]["dest"] == "fp8_gemm_runner_backend"
    assert options["--cuda-graph-bs"]["dest"] == options["--cuda-graph-bs-decode"]["dest"]
    assert "cuda_graph_bs_decode" in dests


def test_data_rebuilds_a_parser_that_splits_an_sglang_command_line(data):
    """What slime does with the data: know how many tokens each `--sglang-*` option takes."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name, entry in data["options"].items():
        names = [name] + entry["aliases"]
        if entry["flag"]:
            parser.add_argument(*names, dest=name, action="count")
        else:
            parser.add_argument(*names, dest=name, nargs=entry["nargs"])
    argv = [
        "--cuda-graph-bs",
        "1",
        "2",
        "4",
        "--enable-dp-attention",
        "--ep",
        "8",
        "--tp-size",
        "8",
        "--mem-fraction-static",
        "0.7",
        "--no-dllm-fdfo",
        "--model-checksum",
        "--log-level",
        "info",
        "--uvicorn-access-log-exclude-prefixes",
        "--enable-memory-saver",
    ]
    ns, rest = parser.parse_known_args(argv)
    got = vars(ns)
    assert rest == []
    assert got["--cuda-graph-bs"] == ["1", "2", "4"]
    assert got["--enable-dp-attention"] == 1 and got["--enable-memory-saver"] == 1
    assert got["--ep-size"] == "8" and got["--tp-size"] == "8"
    assert got["--mem-fraction-static"] == "0.7" and got["--log-level"] == "info"
    assert got["--dllm-fdfo"] == 1
    assert got["--model-checksum"] is None  # "?" took nothing before the next option
    assert got["--uvicorn-access-log-exclude-prefixes"] == []


# --------------------------------------------------------------------------- the extractor itself


def _load_script():
    spec = importlib.util.spec_from_file_location("extract_sglang_args", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SYNTHETIC = textwrap.dedent('''
    from __future__ import annotations
    import argparse, dataclasses
    from typing import List, Literal, Optional, Union
    from sglang.srt.arg_groups.arg_utils import NS, A, Arg, add_cli_args_from_dataclass
    from sglang.srt.arg_groups.argparse_actions import DeprecatedAction, DeprecatedAliasStoreAction, LoRAPathAction

    @dataclasses.dataclass
    class ServerArgs:
        """Docstring."""
        model_path: A[str, Arg(help="m", aliases=["--model"]), NS("model")]
        tp_size: A[int, "tp", NS("parallel")] = 1
        enable_x: A[bool, "x"] = False
        maybe_y: A[Optional[bool], "y"] = None
        sizes: A[Optional[List[int]], "s"] = None
        star: A[List[str], Arg(help="st", nargs="*")] = dataclasses.field(default_factory=list)
        json_list: A[Optional[List[str]], Arg(help="j", type_parser=json.loads)] = None
        mode: A[Literal["a", "b"], "mode"] = "a"
        both: A[Optional[Union[set[str], List[str]]], Arg(help="u", nargs="*")] = None
        renamed_backend: A[str, Arg(help="r", cli_name="--short-backend")] = "auto"
        opt: A[Optional[bool], Arg(help="o", action=argparse.BooleanOptionalAction)] = None
        paths: A[Optional[List[str]], Arg(help="p", action=LoRAPathAction, action_kwargs={"type": str, "nargs": "*"})] = None
        maybe: A[Optional[str], Arg(help="q", nargs="?", const="")] = None
        hidden: A[bool, Arg(no_cli=True)] = False
        by_hand: A[Optional[str], NS("serving")] = None
        plain: int = 3

        def __post_init__(self):
            pass

        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser):
            add_cli_args_from_dataclass(parser, ServerArgs)
            parser.add_argument("--by-hand", type=str, choices=["auto"] + [])
            parser.add_argument("--config", type=str, help="c")
            parser.add_argument("--gone", action=DeprecatedAction, help="g")
            parser.add_argument("--old-sizes", type=int, nargs="+", action=DeprecatedAliasStoreAction, dest="sizes")
            parser.add_argument("--legacy", action="store_true")
''')


def test_extractor_follows_add_cli_args_rules(tmp_path):
    module = _load_script()
    src = tmp_path / "server_args.py"
    src.write_text(SYNTHETIC, encoding="utf-8")
    out = tmp_path / "out.json"
    assert module.main([str(src), "--commit", "0" * 40, "-o", str(out)]) == 0
    got = json.loads(out.read_text(encoding="utf-8"))
    shape = {k: (v["nargs"], v["flag"]) for k, v in got["options"].items()}
    assert shape == {
        "--model-path": (ONE, False),
        "--tp-size": (ONE, False),
        "--enable-x": (0, True),
        "--maybe-y": (0, True),
        "--sizes": ("+", False),
        "--star": ("*", False),
        "--json-list": (ONE, False),
        "--mode": (ONE, False),
        "--both": ("*", False),
        "--short-backend": (ONE, False),
        "--opt": (0, True),
        "--paths": ("*", False),
        "--maybe": ("?", False),
        "--by-hand": (ONE, False),
        "--config": (ONE, False),
        "--gone": (0, True),
        "--old-sizes": ("+", False),
        "--legacy": (0, True),
    }
    assert got["aliases"] == {"--model": "--model-path", "--no-opt": "--opt"}
    assert got["options"]["--short-backend"]["dest"] == "renamed_backend"
    assert got["options"]["--short-backend"]["declared_dest"] is True
    assert got["options"]["--old-sizes"]["dest"] == "sizes"
    assert got["source"]["commit"] == "0" * 40
    assert got["undetermined"] == []


def test_extractor_refuses_an_option_registered_twice(tmp_path):
    module = _load_script()
    src = tmp_path / "server_args.py"
    src.write_text(SYNTHETIC.replace('"--legacy"', '"--tp-size"'), encoding="utf-8")
    with pytest.raises(SystemExit, match="--tp-size"):
        module.main([str(src), "-o", str(tmp_path / "out.json")])


def test_extractor_reports_an_unknown_action_instead_of_guessing_silently(tmp_path):
    module = _load_script()
    src = tmp_path / "server_args.py"
    src.write_text(SYNTHETIC.replace('action="store_true"', "action=SomeNewAction"), encoding="utf-8")
    out = tmp_path / "out.json"
    module.main([str(src), "-o", str(out)])
    got = json.loads(out.read_text(encoding="utf-8"))
    assert [u["option"] for u in got["undetermined"]] == ["--legacy"]
