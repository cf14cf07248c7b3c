"""Install the OpenMMLab stack for ``model=mmdet3d``: mmcv 2.1.0 built once with its compiled ops
(cached as a wheel), mmdet 3.3.0, mmdet3d 1.4.0 and the light dependencies of the ``openmmlab`` extra.

``python -m drivebench.openmmlab.install [--check] [--rebuild] [--wheel-only]`` (also
``scripts/install_openmmlab.sh``). Why a script: mmcv has no wheel for recent torch builds, and its
source build fails in four known ways, each handled here:

* its ``setup.py`` imports ``pkg_resources`` (gone from setuptools >= 70): the build runs with
  ``setuptools<70``, ``wheel`` and ``ninja`` from a private overlay directory (PYTHONPATH), so the
  environment keeps its own setuptools;
* torch >= 2.14's headers need C++20 and mmcv asks for C++17: the standard is patched to c++20;
* without ``MMCV_WITH_OPS=1`` the result is mmcv-lite (no ``mmcv._ext``; mmdet3d cannot import);
* ``FORCE_CUDA`` must match the machine: CUDA ops only where a GPU and nvcc are present.

The compiles go through :mod:`drivebench.openmmlab.pch` (``CXX``), which precompiles the header that 63 of
the 77 C++ files start with once, from the first compile's own flags: half the build's CPU time, same code.

The wheel is cached under ``${DRIVEBENCH_CACHE:-~/.cache/drivebench}/wheels/<python>-torch<version>-
<ops>/``, so a second install (CI reruns, fresh venvs on the same machine) takes seconds.
mmdet3d is installed without its dependencies (they include open3d, ~400 MB, for visualisation only);
the ones it needs to import and train are in the extra.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
import time
from pathlib import Path


from drivebench.openmmlab import MMCV_VERSION, MMDET3D_VERSION, MMDET_VERSION
from drivebench.locks import exclusive_lock

REPO = Path(__file__).resolve().parents[2]
BUILD_TOOLS = ("setuptools<70", "wheel", "ninja")
LYFT_SDK = "lyft_dataset_sdk==0.0.8"
PINS = ("numpy<2", "pyarrow<26")  # nuscenes-devkit pins numpy<2; pyarrow 26 needs numpy 2
VERIFY = ("import mmcv, mmcv._ext, mmdet, mmdet3d; from mmdet3d.utils import register_all_modules; "
          "register_all_modules(); print(mmcv.__version__, mmdet.__version__, mmdet3d.__version__, "
          "len([n for n in dir(mmcv._ext) if not n.startswith('_')]))")


class InstallError(RuntimeError):
    """A step failed; the message says which and how to fix it."""


def say(msg: str) -> None:
    print(f"[openmmlab] {msg}", flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("DRIVEBENCH_CACHE") or Path.home() / ".cache" / "drivebench").expanduser()


def torch_info() -> tuple[str, str | None, bool]:
    """(torch version, torch's CUDA version, whether CUDA ops can be built here: GPU + nvcc)."""
    import torch

    cuda = torch.version.cuda
    if not (cuda and torch.cuda.is_available()):
        return torch.__version__, cuda, False
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = CUDA_HOME is not None and (Path(CUDA_HOME) / "bin" / "nvcc").exists()
    if not nvcc:
        say("a GPU is present but no nvcc (CUDA_HOME): building CPU ops only; mmcv ops on CUDA tensors will fail")
    return torch.__version__, cuda, nvcc


def wheel_dir(root: Path | None = None) -> Path:
    """Where this environment's mmcv wheel is cached: keyed by Python tag, torch build and op flavour."""
    version, cuda, with_cuda = torch_info()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    ops = f"cuda{cuda}" if with_cuda else "cpu"
    return (root or cache_root()) / "wheels" / f"{tag}-torch{version}-{ops}"


def run(cmd: list[str], log: Path | None = None, env: dict[str, str] | None = None, what: str = "") -> None:
    """Run a command; on failure raise InstallError with the tail of its output."""
    with tempfile.TemporaryFile("w+") as buf:
        out = open(log, "a") if log is not None else buf
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, text=True)
        finally:
            if log is not None:
                out.close()
        if proc.returncode != 0:
            if log is not None:
                text = log.read_text(errors="replace")
            else:
                buf.seek(0)
                text = buf.read()
            tail = "\n".join(text.splitlines()[-25:])
            raise InstallError(f"{what or cmd[0]} failed (exit {proc.returncode}):\n{tail}"
                               + (f"\nfull log: {log}" if log is not None else ""))


def pip(*args: str, log: Path | None = None, env: dict[str, str] | None = None, what: str = "") -> None:
    run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], log=log, env=env, what=what or "pip")


# ---- what is there -------------------------------------------------------------------------------
def extra_requirements() -> list[str]:
    """The ``openmmlab`` extra of drivebench (installed metadata, else the checkout's pyproject)."""
    reqs: list[str] = []
    try:
        for line in importlib.metadata.requires("drivebench") or []:
            if re.search(r"""extra\s*==\s*["']openmmlab["']""", line):
                reqs.append(line.split(";")[0].strip())
    except importlib.metadata.PackageNotFoundError:
        pass
    if not reqs and (REPO / "pyproject.toml").exists() and sys.version_info >= (3, 11):
        import tomllib

        data = tomllib.loads((REPO / "pyproject.toml").read_text())
        reqs = list(data["project"]["optional-dependencies"].get("openmmlab", []))
    return reqs


def unmet(requirements: list[str]) -> list[str]:
    """Requirements not satisfied by what is installed."""
    from packaging.requirements import Requirement

    missing = []
    for text in requirements:
        req = Requirement(text)
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(text)
    return missing


def verify() -> tuple[bool, str]:
    """Import the stack in a fresh interpreter: (ok, versions + op count, or the error)."""
    proc = subprocess.run([sys.executable, "-c", VERIFY], capture_output=True, text=True)
    if proc.returncode == 0:
        mmcv, mmdet, mmdet3d, ops = proc.stdout.split()
        return True, f"mmcv {mmcv} ({ops} compiled op functions), mmdet {mmdet}, mmdet3d {mmdet3d}"
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return False, lines[-1] if lines else f"exit {proc.returncode}"


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- the mmcv build ------------------------------------------------------------------------------
def check_compiler() -> None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise InstallError("no C++ compiler found: install one (Debian/Ubuntu: `apt-get install g++`), "
                           "or set CXX")
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        raise InstallError(f"Python headers missing ({sysconfig.get_paths()['include']}/Python.h): install the "
                           "python3-dev package of this Python")


def patch_cxx_standard(setup_py: Path, torch_version: str) -> int:
    """torch >= 2.14 headers need C++20: replace mmcv's -std=c++14/17 (not MSVC's /std:); returns count."""
    major, minor = (int(x) for x in re.findall(r"\d+", torch_version)[:2])
    if (major, minor) < (2, 14):
        return 0
    text = setup_py.read_text()
    new, count = re.subn(r"-std=c\+\+1[47]", "-std=c++20", text)
    if count == 0 and "-std=c++20" not in text:
        raise InstallError(f"{setup_py}: no -std=c++14/17 flag found to raise to c++20 for torch {torch_version}; "
                           "mmcv's setup.py changed, patch it by hand")
    setup_py.write_text(new)
    return count


def fetch_sdist(dest: Path, tools: Path, log: Path) -> Path:
    """mmcv's source distribution, downloaded once into the wheel cache."""
    found = sorted(dest.glob(f"mmcv-{MMCV_VERSION}.tar.gz"))
    if found:
        return found[0]
    say(f"downloading the mmcv {MMCV_VERSION} source distribution")
    env = {**os.environ, "PYTHONPATH": _pythonpath(tools)}
    pip("download", f"mmcv=={MMCV_VERSION}", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
        "-d", str(dest), log=log, env=env, what="downloading the mmcv sdist (network to PyPI needed)")
    found = sorted(dest.glob(f"mmcv-{MMCV_VERSION}.tar.gz"))
    if not found:
        raise InstallError(f"pip download left no mmcv-{MMCV_VERSION}.tar.gz in {dest}; see {log}")
    return found[0]


def _pythonpath(tools: Path) -> str:
    return os.pathsep.join([str(tools), *filter(None, [os.environ.get("PYTHONPATH")])])


def _progress(log: Path, stop: threading.Event, t0: float) -> None:
    """Every 30 s: how many of the ops' objects ninja has compiled (from pip -v's log)."""
    pattern = re.compile(r"\[(\d+)/(\d+)\]")
    while not stop.wait(30):
        try:
            hits = pattern.findall(log.read_text(errors="replace")[-20000:])
        except OSError:
            hits = []
        done = f"{hits[-1][0]}/{hits[-1][1]} objects" if hits else "starting"
        say(f"  compiling mmcv ops: {done}, {time.perf_counter() - t0:.0f} s")


PCH_HEADER = Path("mmcv", "ops", "csrc", "common", "pytorch_cpp_helper.hpp")  # 63 of the 77 C++ files start with it


def compiler_wrapper(bindir: Path, header: Path) -> dict[str, str]:
    """The environment that compiles mmcv through :mod:`drivebench.openmmlab.pch` (``header`` precompiled
    once, with the flags of the first compile): ``CXX`` is a script in ``bindir`` calling it, the real
    compiler stays ``$CXX`` (or ``c++``). Cuts the CPU time of the ops' compiles by about a half."""
    bindir.mkdir(parents=True, exist_ok=True)
    script = bindir / "c++-pch"
    pch = Path(__file__).with_name("pch.py")
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S {shlex.quote(str(pch))} "$@"\n')
    script.chmod(0o755)
    return {"CXX": str(script), "DRIVEBENCH_PCH_CXX": os.environ.get("CXX") or "c++",
            "DRIVEBENCH_PCH_HEADER": str(header)}


def pch_note(log: Path) -> str:
    """What the build log says about the precompiled header (made? rejected by some compiles?)."""
    text = log.read_text(errors="replace")
    if "drivebench pch: precompiled" not in text:
        return "; no precompiled header was made" + (" (it failed: see the log)" if "drivebench pch:" in text else "")
    rejected = len(re.findall(r"warning: .*\.gch.*\[-Winvalid-pch\]", text))
    return "; precompiled header made" + (f", {rejected} -Winvalid-pch warnings (see the log)" if rejected else "")


def build_wheel(dest: Path, jobs: int) -> Path:
    """Build mmcv's wheel with its ops into ``dest``; returns the wheel."""
    check_compiler()
    version, cuda, with_cuda = torch_info()
    dest.mkdir(parents=True, exist_ok=True)
    log = dest / "build.log"
    log.write_text("")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mmcv-build-") as tmp:
        tools = Path(tmp) / "tools"
        say(f"build tools ({', '.join(BUILD_TOOLS)}) into a private directory")
        pip("install", "-q", "--target", str(tools), *BUILD_TOOLS, log=log, what="installing the build tools")
        sdist = fetch_sdist(dest.parent / "src", tools, log)
        with tarfile.open(sdist) as tar:
            try:
                tar.extractall(tmp, filter="data")
            except TypeError:  # Python < 3.10.12 / 3.11.4: no extraction filters
                tar.extractall(tmp)
        src = Path(tmp) / f"mmcv-{MMCV_VERSION}"
        patched = patch_cxx_standard(src / "setup.py", version)
        flavour = f"CPU + CUDA {cuda} ops" if with_cuda else "CPU ops"
        say(f"building mmcv {MMCV_VERSION} with {flavour} against torch {version} ({jobs} jobs"
            + (f", C++ standard raised to c++20 in {patched} places" if patched else "") + f"); log: {log}")
        env = {**os.environ, "MMCV_WITH_OPS": "1", "FORCE_CUDA": "1" if with_cuda else "0", "MAX_JOBS": str(jobs),
               "PYTHONPATH": _pythonpath(tools), "PATH": os.pathsep.join([str(tools / "bin"), os.environ["PATH"]]),
               # no debug info: a quarter less compile time and a 10x smaller library; same code.
               # -Winvalid-pch: the log says so where a compile cannot use the precompiled header
               "CFLAGS": (os.environ.get("CFLAGS", "") + " -g0 -Winvalid-pch").strip()}
        if (src / PCH_HEADER).exists():
            env.update(compiler_wrapper(Path(tmp) / "pch-bin", src / PCH_HEADER))
        else:
            say(f"{PCH_HEADER} not in mmcv's source: compiling without a precompiled header")
        out = Path(tmp) / "wheels"
        stop = threading.Event()
        ticker = threading.Thread(target=_progress, args=(log, stop, t0), daemon=True)
        ticker.start()
        try:
            pip("wheel", "-v", "--no-build-isolation", "--no-deps", str(src), "-w", str(out), log=log, env=env,
                what=f"building mmcv {MMCV_VERSION}")
        finally:
            stop.set()
        built = sorted(out.glob(f"mmcv-{MMCV_VERSION}-*.whl"))
        if not built:
            raise InstallError(f"the build produced no mmcv wheel; see {log}")
        final = dest / built[0].name
        shutil.move(str(built[0]), final)
    say(f"built {final.name} in {time.perf_counter() - t0:.0f} s (cached in {dest})" + pch_note(log))
    return final


# ---- the install ---------------------------------------------------------------------------------
def install(rebuild: bool = False, wheel_only: bool = False, jobs: int | None = None) -> Path | None:
    """Make ``model=mmdet3d`` usable here; returns the mmcv wheel used (None when nothing was needed)."""
    t0 = time.perf_counter()
    dest = wheel_dir()
    jobs = jobs or os.cpu_count() or 2
    with exclusive_lock(dest.parent / ".install.lock"):
        ok, detail = verify()
        if ok and not rebuild and not wheel_only and not unmet(extra_requirements()):
            say(f"already installed: {detail}")
            return None
        extra = unmet(extra_requirements())
        if extra and not wheel_only:
            say(f"installing the openmmlab extra's dependencies: {' '.join(extra)}")
            pip("install", "-q", *extra, *PINS, what="installing the openmmlab extra")
        wheels = [] if rebuild else sorted(dest.glob(f"mmcv-{MMCV_VERSION}-*.whl"))
        wheel = wheels[0] if wheels else build_wheel(dest, jobs)
        if wheels:
            say(f"using the cached wheel {wheel}")
        if wheel_only:
            return wheel
        if installed("mmcv-lite"):
            say("removing mmcv-lite (no compiled ops; it shadows mmcv)")
            pip("uninstall", "-y", "mmcv-lite", what="removing mmcv-lite")
        say(f"installing {wheel.name}, mmdet {MMDET_VERSION} and mmdet3d {MMDET3D_VERSION} (without open3d)")
        pip("install", "-q", "--no-deps", "--force-reinstall", str(wheel), what="installing the mmcv wheel")
        if installed("mmdet") != MMDET_VERSION:
            pip("install", "-q", "--no-deps", f"mmdet=={MMDET_VERSION}", what="installing mmdet")
        if installed("mmdet3d") != MMDET3D_VERSION:
            pip("install", "-q", "--no-deps", f"mmdet3d=={MMDET3D_VERSION}", what="installing mmdet3d")
        if installed("lyft_dataset_sdk") is None:  # mmdet3d.evaluation imports it; its deps pull plotly, pytest
            pip("install", "-q", "--no-deps", LYFT_SDK, what="installing lyft_dataset_sdk")
        ok, detail = verify()
        if not ok:
            raise InstallError(f"installed, but the stack does not import: {detail}\n"
                               f"rebuild against this torch with `{sys.executable} -m drivebench.openmmlab.install "
                               "--rebuild`")
    say(f"ready in {time.perf_counter() - t0:.0f} s: {detail}")
    return wheel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m drivebench.openmmlab.install", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report whether the stack imports (exit 1 if not)")
    ap.add_argument("--rebuild", action="store_true", help="build the mmcv wheel again even if one is cached")
    ap.add_argument("--wheel-only", action="store_true", help="build (or find) the cached wheel, install nothing")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    args = ap.parse_args(argv)
    if args.check:
        ok, detail = verify()
        extra = unmet(extra_requirements())
        say(("ready: " if ok and not extra else "not ready: ") + detail
            + (f"; missing from the openmmlab extra: {' '.join(extra)}" if extra else ""))
        say(f"wheel cache: {wheel_dir()}")
        return 0 if ok and not extra else 1
    try:
        install(rebuild=args.rebuild, wheel_only=args.wheel_only, jobs=args.jobs)
    except InstallError as err:
        print(f"[openmmlab] error: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
