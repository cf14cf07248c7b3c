"""The mmcv build's compiler wrapper (drivebench/openmmlab/pch.py), without building mmcv: a recording
fake compiler shows what the wrapper runs (the header precompiled once however many compiles start
together, every command passed through unchanged), and one real GCC compile of a tiny header shows
that GCC uses the .gch the wrapper made (it ignores one made with other flags without a word)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drivebench.openmmlab.install import compiler_wrapper

FAKE_CXX = '''
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_CXX_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if "c++-header" in args:
    time.sleep(0.5)  # long enough for every other compile to arrive meanwhile
    if os.environ.get("FAKE_CXX_FAIL_HEADER"):
        print("fatal error: no space", file=sys.stderr)
        sys.exit(1)
if "-o" in args:
    with open(args[args.index("-o") + 1], "w") as out:
        out.write("built")
'''


def _compile_args(src: Path, obj: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """A compile command as torch's ninja file writes it for mmcv (the doubled -c included)."""
    return ["-MMD", "-MF", f"{obj}.d", "-DNDEBUG", "-O3", "-g0", "-fPIC", "-I", str(src.parent), "-Iinclude/torch",
            "-c", "-c", str(src), "-o", str(obj), "-std=c++20", "-DTORCH_EXTENSION_NAME=_ext", *extra]


@pytest.fixture
def fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fake compiler behind the wrapper script that the installer writes; returns (env, header, calls())."""
    fake = tmp_path / "fake_cxx.py"
    fake.write_text(FAKE_CXX)
    log = tmp_path / "calls.jsonl"
    header = tmp_path / "common" / "pytorch_cpp_helper.hpp"
    header.parent.mkdir()
    header.write_text("#pragma once\n")
    monkeypatch.setenv("CXX", f"{sys.executable} {fake}")  # the real compiler the wrapper is to call
    env = {**os.environ, **compiler_wrapper(tmp_path / "bin", header), "FAKE_CXX_LOG": str(log)}

    def calls() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return env, header, calls


def test_header_precompiled_once_under_concurrent_compiles_and_every_command_passed_through(fake_build, tmp_path):
    env, header, calls = fake_build
    wrapper = env["CXX"]
    compiles = [_compile_args(tmp_path / f"op{i}.cpp", tmp_path / f"op{i}.o") for i in range(6)]
    procs = [subprocess.Popen([wrapper, *args], env=env, stderr=subprocess.PIPE, text=True) for args in compiles]
    errs = [proc.communicate(timeout=60)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 6, errs

    recorded = calls()
    headers = [c for c in recorded if "c++-header" in c]
    assert len(headers) == 1, headers  # made once, while the five other compiles waited for it
    flags = ["-DNDEBUG", "-O3", "-g0", "-fPIC", "-I", str(tmp_path), "-Iinclude/torch", "-std=c++20",
             "-DTORCH_EXTENSION_NAME=_ext"]  # the compile's own flags: no source, object or dependency file
    assert headers[0][:-2] == [*flags, "-x", "c++-header", str(header)] and headers[0][-2] == "-o"
    assert sorted(c for c in recorded if "c++-header" not in c) == sorted(compiles)  # each exactly as asked
    made = list((header.parent / f"{header.name}.gch").iterdir())
    assert len(made) == 1 and made[0].suffix == ".gch" and made[0].read_text() == "built"
    assert sum("drivebench pch: precompiled pytorch_cpp_helper.hpp" in err for err in errs) == 1

    # a compile with other flags gets its own .gch next to the first; a link or `-v` makes none
    other = _compile_args(tmp_path / "pybind.cpp", tmp_path / "pybind.o", ("-DWITH_CUDA",))
    link = ["-shared", str(tmp_path / "op0.o"), str(tmp_path / "op1.o"), "-o", str(tmp_path / "_ext.so")]
    for args in (other, link, ["-v"]):
        subprocess.run([wrapper, *args], env=env, check=True, capture_output=True)
    assert len(list((header.parent / f"{header.name}.gch").iterdir())) == 2
    assert calls()[len(recorded):] == [[*flags, "-DWITH_CUDA", "-x", "c++-header", str(header), "-o",
                                        calls()[len(recorded)][-1]], other, link, ["-v"]]


def test_a_failed_precompile_is_tried_once_and_the_compiles_go_on(fake_build, tmp_path):
    env, header, calls = fake_build
    env = {**env, "FAKE_CXX_FAIL_HEADER": "1"}
    compiles = [_compile_args(tmp_path / f"op{i}.cpp", tmp_path / f"op{i}.o") for i in range(3)]
    results = [subprocess.run([env["CXX"], *args], env=env, capture_output=True, text=True) for args in compiles]
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    assert "precompiling pytorch_cpp_helper.hpp failed (exit 1" in results[0].stderr
    assert [c for c in calls() if "c++-header" not in c] == compiles
    assert len([c for c in calls() if "c++-header" in c]) == 1  # not retried by every later compile
    (failed,) = header.parent.glob(".*.failed")
    assert "fatal error: no space" in failed.read_text()
    gch_dir = header.parent / f"{header.name}.gch"
    assert not gch_dir.exists() or not any(gch_dir.iterdir())
    assert all((tmp_path / f"op{i}.o").exists() for i in range(3))


def test_gcc_uses_the_gch_the_wrapper_made(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """GCC's -H marks a used precompiled header with '!'; a .gch made with other flags would be skipped
    (here: -Winvalid-pch says so), so this is the check that the flags are copied right."""
    gxx = shutil.which("g++") or shutil.which("c++")
    assert gxx, "no C++ compiler (the mmcv build needs one too)"
    header = tmp_path / "common" / "pytorch_cpp_helper.hpp"
    header.parent.mkdir()
    header.write_text("#include <vector>\n#include <string>\ninline int helper() { return 3; }\n")
    src = tmp_path / "op.cpp"
    src.write_text('#include "pytorch_cpp_helper.hpp"\nint op() { std::vector<std::string> v; return helper(); }\n')
    monkeypatch.setenv("CXX", gxx)
    env = {**os.environ, **compiler_wrapper(tmp_path / "bin", header)}
    args = ["-MMD", "-MF", str(tmp_path / "op.o.d"), "-O1", "-fPIC", "-Winvalid-pch", "-I", str(header.parent),
            "-c", str(src), "-o", str(tmp_path / "op.o"), "-std=c++20", "-H"]
    result = subprocess.run([env["CXX"], *args], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (gch,) = (header.parent / f"{header.name}.gch").iterdir()
    assert f"! {gch}" in result.stderr, result.stderr[-2000:]  # used, not parsed again
    assert "Winvalid-pch" not in result.stderr and (tmp_path / "op.o").exists()
