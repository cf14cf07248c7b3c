"""Family 1: versions of the stack, and the combinations known to break.

Known-bad combinations come from the field: pyarrow >= 26 fails at import beside numpy < 2;
nuscenes-devkit 1.2.0 pins numpy < 2; a torchvision wheel built for another torch fails on its
first C++ op ("operator torchvision::nms does not exist"); a CUDA build of torch needs a driver
whose CUDA version is at least as new.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import drivebench
from drivebench.doctor.context import DoctorContext
from drivebench.doctor.probe import error_text, installed_version, try_import, version_tuple
from drivebench.doctor.result import Check, CheckResult, failed, informed, passed, warned
from drivebench.hardware import nvml
from drivebench.start_method import FORK_DEADLOCK_FIXED, has_fork_deadlock

MIN_PYTHON = (3, 10)
TORCHVISION_MINOR_OFFSET = 15  # torchvision 0.(m+15) pairs with torch 2.m (0.15 <-> 2.0 ... 0.29 <-> 2.14)


def python_version(ctx: DoctorContext, version_info: tuple[int, ...] | None = None) -> CheckResult:
    """Python interpreter version (drivebench needs 3.10 or newer; 3.10 and 3.11 a release with the fork fix)."""
    info = tuple(version_info or sys.version_info[:3])
    version = ".".join(map(str, info[:3]))
    data = {"python": version, "executable": sys.executable}
    if info[:2] < MIN_PYTHON:
        return failed(f"Python {version} at {sys.executable}",
                      f"use Python >= {'.'.join(map(str, MIN_PYTHON))} (e.g. `python3.11 -m venv .venv`)", data)
    if has_fork_deadlock(info):
        return warned(f"Python {version} ({sys.executable}) can deadlock a forked child process (CPython gh-112275): "
                      "drivebench starts loader workers by forkserver in gloo DDP ranks, where it was seen",
                      f"use Python >= {'.'.join(map(str, FORK_DEADLOCK_FIXED[info[:2]]))} or 3.12", data)
    return passed(f"Python {version} ({sys.executable})", data)


def torch_version(ctx: DoctorContext) -> CheckResult:
    """torch, the CUDA and cuDNN it was built with, and whether it can see the GPUs the driver lists."""
    torch, err = try_import("torch")
    if torch is None:
        return failed(f"torch does not import: {err}", "reinstall torch: `pip install --force-reinstall torch`")
    cuda = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    data = {"torch": torch.__version__, "cuda": cuda, "cudnn": cudnn, "cuda_available": torch.cuda.is_available()}
    saw = f"torch {torch.__version__}, CUDA {cuda or 'none (CPU build)'}, cuDNN {cudnn or 'none'}"
    driver_gpus = nvml.device_count()
    if driver_gpus and cuda is None:
        return failed(f"{saw}; the driver lists {driver_gpus} GPU(s) but this torch is a CPU-only build",
                      "install a CUDA build of torch, e.g. `pip install torch --index-url "
                      "https://download.pytorch.org/whl/cu128` (pick the CUDA your driver supports)", data)
    return passed(saw, data)


def nccl_version(ctx: DoctorContext) -> CheckResult:
    """NCCL version bundled with torch, and NCCL_* variables already set in this environment."""
    torch, err = try_import("torch")
    if torch is None:
        return failed(f"torch does not import: {err}", "reinstall torch")
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}
    data = {"nccl": None, "env": env}
    if torch.version.cuda is None:
        return informed("no NCCL (CPU build of torch; DDP uses gloo)", "", data)
    try:
        version = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as err:
        return warned(f"torch {torch.__version__} has no usable NCCL ({error_text(err)})",
                      "multi-GPU DDP needs NCCL: install an official CUDA wheel of torch", data)
    data["nccl"] = version
    env_text = ", ".join(f"{k}={v}" for k, v in env.items()) or "no NCCL_* variables set"
    saw = f"NCCL {version}; {env_text}"
    if env.get("NCCL_NVLS_ENABLE") not in (None, "0"):
        return warned(saw, "export NCCL_NVLS_ENABLE=0: NVLink multicast must stay off on these machines", data)
    return passed(saw, data)


def driver_version(ctx: DoctorContext) -> CheckResult:
    """NVIDIA driver version and the newest CUDA it supports, against the CUDA torch was built with."""
    torch, _ = try_import("torch")
    torch_cuda = getattr(getattr(torch, "version", None), "cuda", None)
    info = nvml.driver_info()
    if info is None:
        return informed("no NVIDIA driver (NVML not found): a CPU machine", "", {"torch_cuda": torch_cuda})
    driver, driver_cuda = info
    data = {"driver": driver, "driver_cuda": driver_cuda, "torch_cuda": torch_cuda}
    saw = f"driver {driver} (supports CUDA up to {driver_cuda or 'unknown'}); torch built with CUDA {torch_cuda}"
    have, need = version_tuple(driver_cuda), version_tuple(torch_cuda)
    if have and need and have[:1] < need[:1]:
        return failed(saw, f"update the NVIDIA driver to one supporting CUDA {torch_cuda}, or install a torch "
                           f"built for CUDA {driver_cuda} (`--index-url https://download.pytorch.org/whl/cu"
                           f"{''.join(map(str, have[:2]))}`)", data)
    if have and need and have[:2] < need[:2]:
        return warned(saw, f"CUDA minor-version compatibility runs most kernels, but PTX JIT and some libraries "
                           f"need a driver for CUDA {torch_cuda}: update the driver when you can", data)
    return passed(saw, data)


def lightning_version(ctx: DoctorContext) -> CheckResult:
    """Lightning (``lightning.pytorch``), and a second, different ``pytorch_lightning`` beside it."""
    module, err = try_import("lightning")
    if module is None:
        return failed(f"lightning does not import: {err}", "`pip install 'lightning>=2.4,<2.8'`")
    version = getattr(module, "__version__", installed_version("lightning"))
    legacy = installed_version("pytorch-lightning")
    data = {"lightning": version, "pytorch_lightning": legacy}
    if legacy and version_tuple(legacy) != version_tuple(version):
        return warned(f"lightning {version} and pytorch-lightning {legacy} are both installed",
                      "objects from one package are rejected by the other's Trainer: `pip install "
                      f"pytorch-lightning=={version}` or uninstall it (drivebench uses lightning.pytorch)", data)
    return passed(f"lightning {version}" + (f" (pytorch-lightning {legacy} matches)" if legacy else ""), data)


def hydra_version(ctx: DoctorContext) -> CheckResult:
    """hydra-core and omegaconf (the config layer)."""
    versions = {}
    for module_name, dist in (("hydra", "hydra-core"), ("omegaconf", "omegaconf")):
        module, err = try_import(module_name)
        if module is None:
            return failed(f"{module_name} does not import: {err}", f"`pip install --force-reinstall {dist}`")
        versions[dist] = getattr(module, "__version__", installed_version(dist))
    return passed(", ".join(f"{k} {v}" for k, v in versions.items()), versions)


def torchvision_version(ctx: DoctorContext) -> CheckResult:
    """torchvision, and whether its C++ ops load against this torch (``torchvision.ops.nms``)."""
    torch, err = try_import("torch")
    if torch is None:
        return failed(f"torch does not import: {err}", "reinstall torch")
    pair = _paired_torchvision(torch.__version__)
    remedy = (f"install the torchvision built for torch {torch.__version__}: `pip install torchvision=={pair}` "
              f"from the same index as torch" if pair else "reinstall torch and torchvision together")
    tv, err = try_import("torchvision")
    if tv is None:
        return failed(f"torchvision does not import: {err}", remedy)
    data = {"torchvision": tv.__version__, "torch": torch.__version__, "expected": pair}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        try:
            boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]], device=device)
            keep = tv.ops.nms(boxes, torch.tensor([0.9, 0.8], device=device), 0.5)
            kept = keep.tolist()  # a host sync on two elements: this is a one-off load test
        except Exception as err:
            return failed(f"torchvision {tv.__version__} is installed but its ops do not load against torch "
                          f"{torch.__version__} on {device}: {error_text(err)}", remedy, data)
        if kept != [0]:
            return failed(f"torchvision.ops.nms on {device} returned {kept}, expected [0]", remedy, data)
    tv_tag, torch_tag = _local_tag(tv.__version__), _local_tag(torch.__version__)
    saw = f"torchvision {tv.__version__} (nms loads on {', '.join(devices)})"
    if pair and version_tuple(tv.__version__)[:2] != version_tuple(pair)[:2]:
        return warned(f"{saw}, but torch {torch.__version__} pairs with torchvision {pair}", remedy, data)
    if tv_tag and torch_tag and tv_tag != torch_tag:
        return warned(f"{saw}, but it was built for {tv_tag} and torch for {torch_tag}", remedy, data)
    return passed(saw, data)


def _paired_torchvision(torch_version: str) -> str | None:
    major_minor = version_tuple(torch_version)[:2]
    if len(major_minor) < 2 or major_minor[0] != 2:
        return None
    return f"0.{major_minor[1] + TORCHVISION_MINOR_OFFSET}"


def _local_tag(version: str) -> str | None:
    return version.split("+", 1)[1] if "+" in version else None


def numpy_version(ctx: DoctorContext) -> CheckResult:
    """numpy (2.x breaks nuscenes-devkit 1.2.0 and pyarrow < 26 wheels built for 1.x, and vice versa)."""
    numpy, err = try_import("numpy")
    if numpy is None:
        return failed(f"numpy does not import: {err}", "`pip install --force-reinstall 'numpy<2'`")
    return passed(f"numpy {numpy.__version__}", {"numpy": numpy.__version__})


def pyarrow_version(ctx: DoctorContext) -> CheckResult:
    """pyarrow (Argoverse 2 parquet); pyarrow >= 26 with numpy < 2 fails at import."""
    numpy_v = installed_version("numpy")
    pyarrow_v = installed_version("pyarrow")
    data = {"pyarrow": pyarrow_v, "numpy": numpy_v}
    bad_pair = version_tuple(pyarrow_v)[:1] >= (26,) and version_tuple(numpy_v)[:1] < (2,)
    remedy = "`pip install 'pyarrow<26'` (pyarrow 26 needs numpy >= 2, which nuscenes-devkit 1.2.0 rejects)"
    module, err = try_import("pyarrow")
    if module is None:
        saw = f"pyarrow {pyarrow_v or '(not installed)'} does not import: {err}"
        return failed(saw, remedy if bad_pair or pyarrow_v else "`pip install 'pyarrow<26'`", data)
    if bad_pair:
        return failed(f"pyarrow {pyarrow_v} with numpy {numpy_v}: a combination that breaks at import", remedy, data)
    return passed(f"pyarrow {module.__version__}", data)


def nuscenes_version(ctx: DoctorContext) -> CheckResult:
    """nuscenes-devkit (nuScenes tables and maps); 1.2.0 pins numpy < 2."""
    version, numpy_v = installed_version("nuscenes-devkit"), installed_version("numpy")
    data = {"nuscenes_devkit": version, "numpy": numpy_v}
    module, err = try_import("nuscenes")
    if module is None:
        return failed(f"nuscenes-devkit {version or '(not installed)'} does not import: {err}",
                      "`pip install nuscenes-devkit==1.2.0 'numpy<2'`", data)
    if version_tuple(version) == (1, 2, 0) and version_tuple(numpy_v)[:1] >= (2,):
        return warned(f"nuscenes-devkit {version} with numpy {numpy_v} (the devkit pins numpy < 2)",
                      "imports work, but parts of the devkit were not written for numpy 2: "
                      "`pip install 'numpy<2' 'pyarrow<26'` if nuScenes code misbehaves", data)
    return passed(f"nuscenes-devkit {version}", data)


def av2_version(ctx: DoctorContext) -> CheckResult:
    """av2 (Argoverse 2 API: scenario parquet and map json)."""
    version = installed_version("av2")
    module, err = try_import("av2.datasets.motion_forecasting.scenario_serialization")
    if module is None:
        return failed(f"av2 {version or '(not installed)'} does not import: {err}", "`pip install av2==0.3.6`",
                      {"av2": version})
    return passed(f"av2 {version}", {"av2": version})


def declared_dependencies(ctx: DoctorContext) -> CheckResult:
    """Every dependency drivebench declares (pyproject.toml) is installed, in its declared range."""
    try:
        from packaging.requirements import Requirement
    except ImportError as err:
        return informed(f"cannot compare versions without `packaging` ({err})")
    declared = _declared_requirements()
    if declared is None:
        return informed("drivebench's declared dependencies were not found (not installed, no pyproject.toml)")
    missing, outside = [], []
    for text in declared:
        req = Requirement(text)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        version = installed_version(req.name)
        if version is None:
            missing.append(req.name)
        elif req.specifier and not req.specifier.contains(version.split("+")[0], prereleases=True):
            outside.append(f"{req.name} {version} (declared {req.specifier})")
    data = {"declared": len(declared), "missing": missing, "outside_range": outside}
    if missing:
        return failed(f"not installed: {', '.join(missing)}", "`pip install -e .` from the repository root", data)
    if outside:
        return warned(f"outside drivebench's declared ranges: {'; '.join(outside)}",
                      "these versions were not tested together; `pip install -e .` installs the declared ranges", data)
    return passed(f"all {len(declared)} declared dependencies installed within their ranges", data)


def _declared_requirements() -> list[str] | None:
    from importlib.metadata import PackageNotFoundError, requires

    try:
        found = requires("drivebench")
        if found:
            return list(found)
    except PackageNotFoundError:
        pass
    pyproject = Path(drivebench.__file__).resolve().parents[1] / "pyproject.toml"  # a source checkout
    if not pyproject.is_file():
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return None
    return list(tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", []))


CHECKS = [
    Check("versions.python", python_version),
    Check("versions.torch", torch_version),
    Check("versions.nccl", nccl_version),
    Check("versions.driver", driver_version),
    Check("versions.lightning", lightning_version),
    Check("versions.hydra", hydra_version),
    Check("versions.torchvision", torchvision_version),
    Check("versions.numpy", numpy_version),
    Check("versions.pyarrow", pyarrow_version),
    Check("versions.nuscenes_devkit", nuscenes_version),
    Check("versions.av2", av2_version),
    Check("versions.declared", declared_dependencies),
]
