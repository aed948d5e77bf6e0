"""The MKL vendor shim (slime.runtime.mkl_vendor): where it applies, what it preloads, its check,
and `slime serve`'s start with it. The processes of a run that get it are covered in
tests/ray/test_engine_process.py (engines) and tests/e2e/test_ray_auth.py (Ray workers)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from slime.runtime import mkl_vendor

ROOT = Path(__file__).resolve().parents[2]
AMD = {"vendor_id": "AuthenticAMD", "flags": "fpu sse2 avx avx2 fma avx512f"}
HERE = mkl_vendor.not_applicable()  # None: it applies on this machine


@pytest.fixture
def x86_linux(monkeypatch):
    monkeypatch.delenv(mkl_vendor.ENV_SWITCH, raising=False)
    monkeypatch.setattr(mkl_vendor.sys, "platform", "linux")
    monkeypatch.setattr(mkl_vendor.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)


def test_it_applies_only_to_other_vendors_x86_cpus_with_avx2_and_an_mkl_torch(x86_linux, monkeypatch):
    assert mkl_vendor.not_applicable(AMD) is None
    assert mkl_vendor.not_applicable({**AMD, "vendor_id": "HygonGenuine"}) is None
    assert "MKL's own vendor" in mkl_vendor.not_applicable({**AMD, "vendor_id": "GenuineIntel"})
    assert "unknown" in mkl_vendor.not_applicable({})
    assert "without AVX2/FMA" in mkl_vendor.not_applicable({**AMD, "flags": "fpu sse2 avx"})
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    assert mkl_vendor.not_applicable(AMD) == "torch is not built with MKL"
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setattr(mkl_vendor.platform, "machine", lambda: "aarch64")
    assert "not Linux on x86-64" in mkl_vendor.not_applicable(AMD)
    monkeypatch.setattr(mkl_vendor.platform, "machine", lambda: "x86_64")
    for off in ("0", "false", "off"):
        monkeypatch.setenv(mkl_vendor.ENV_SWITCH, off)
        assert mkl_vendor.not_applicable(AMD) == f"{mkl_vendor.ENV_SWITCH}=0"


def test_the_preload_keeps_what_the_environment_preloads(monkeypatch):
    monkeypatch.setattr(mkl_vendor, "shim_library", lambda: "/cache/mkl_vendor_shim-1.so")
    monkeypatch.setenv("LD_PRELOAD", "/a/one.so:/b/two.so")
    assert mkl_vendor.preload_env() == {"LD_PRELOAD": "/cache/mkl_vendor_shim-1.so /a/one.so /b/two.so"}
    monkeypatch.setenv("LD_PRELOAD", "/cache/mkl_vendor_shim-1.so /a/one.so")  # already there: not twice
    assert mkl_vendor.preload_env() == {"LD_PRELOAD": "/cache/mkl_vendor_shim-1.so /a/one.so"}
    assert mkl_vendor.preload_env(enabled=False) == {}
    monkeypatch.setattr(mkl_vendor, "shim_library", lambda: None)  # does not apply, or failed its check
    assert mkl_vendor.preload_env() == {}


@pytest.mark.parametrize(
    "check, why", [("print('mismatch 0.5')", "mismatch 0.5"), ("import os; os.abort()", "exit -6")]
)
def test_a_shim_that_fails_its_check_is_not_used(monkeypatch, tmp_path, caplog, check, why):
    monkeypatch.setenv("SLIME_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(mkl_vendor, "not_applicable", lambda info=None: None)
    monkeypatch.setattr(mkl_vendor, "_shim", mkl_vendor._UNSET)
    monkeypatch.setattr(mkl_vendor, "_CHECK", check)
    with caplog.at_level(logging.WARNING, logger="slime.runtime.mkl_vendor"):
        assert mkl_vendor.shim_library() is None
    assert f"failed its check ({why}" in caplog.text
    assert not list(tmp_path.glob("*.checked"))  # nothing cached: the next machine state checks again
    monkeypatch.setattr(mkl_vendor, "_shim", mkl_vendor._UNSET)
    monkeypatch.setattr(mkl_vendor, "_CHECK", "print('ok')")
    path = mkl_vendor.shim_library()
    assert path is not None and Path(path).parent == tmp_path and list(tmp_path.glob("*.checked"))


_PROBE = textwrap.dedent("""
    import torch
    from slime.runtime.mkl_vendor import loaded
    torch.manual_seed(1)
    a, b = torch.randn(512, 384), torch.randn(384, 640)
    print(loaded(), (a @ b - (a.double() @ b.double()).float()).abs().max().item())
""")


def _probe(env: dict[str, str]) -> tuple[bool, float]:
    env = {**{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, **env, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    flag, err = out.stdout.split()
    return flag == "True", float(err)


def test_a_process_given_the_preload_has_the_shim_and_multiplies_correctly():
    env = mkl_vendor.preload_env()
    assert bool(env) == (HERE is None), HERE
    shim, err = _probe(env)
    assert shim == (HERE is None) and err < 1e-3
    plain, err_plain = _probe({})
    assert not plain and err_plain < 1e-3


def test_reexec_starts_the_same_command_again_once(monkeypatch):
    calls = []
    monkeypatch.setattr(mkl_vendor.os, "environ", {"PATH": "/usr/bin"})
    monkeypatch.setattr(mkl_vendor, "preload_env", lambda enabled=True: {"LD_PRELOAD": "/c/mkl_vendor_shim-1.so"})
    monkeypatch.setattr(mkl_vendor, "loaded", lambda pid="self": False)
    monkeypatch.setattr(mkl_vendor.os, "execv", lambda exe, argv: calls.append((exe, argv)))
    monkeypatch.setattr(mkl_vendor.sys, "orig_argv", ["python3", "-m", "slime.engine.server", "--port", "1"])
    mkl_vendor.reexec_with_shim()
    assert calls == [(sys.executable, [sys.executable, "-m", "slime.engine.server", "--port", "1"])]
    assert os.environ["LD_PRELOAD"] == "/c/mkl_vendor_shim-1.so"
    mkl_vendor.reexec_with_shim()  # the second start: marked, never a third
    assert len(calls) == 1
    monkeypatch.setattr(mkl_vendor.os, "environ", {"PATH": "/usr/bin"})
    monkeypatch.setattr(mkl_vendor, "loaded", lambda pid="self": True)  # already preloaded
    mkl_vendor.reexec_with_shim()
    assert len(calls) == 1
