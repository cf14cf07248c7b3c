"""Family 2: optional native extensions (mmcv, flash-attn, spconv).

drivebench's models are plain PyTorch and need none of these; upstream code does, and their
builds are where environments break: a wheel compiled against another torch fails at import with
"undefined symbol: _ZN3c10..." (the C++ ABI of torch changed), mmcv-lite has no compiled ops at
all. Absent is INFO; installed but not loadable is FAIL, because anything importing it crashes.
"""

from __future__ import annotations

import importlib.metadata
import re
import urllib.parse
from importlib.metadata import distributions

from drivebench.doctor.context import DoctorContext
from drivebench.doctor.probe import error_text, import_or_error, installed_version, is_absent, version_tuple
from drivebench.doctor.result import Check, CheckResult, failed, informed, passed, warned

ABSENT = "not installed (optional: drivebench's models do not need it)"


def _torch_build() -> str:
    try:
        import torch

        return f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})"
    except Exception as err:
        return f"torch not importable ({error_text(err)})"


def _abi_hint(err: Exception) -> str:
    return " (C++ ABI mismatch: built against another torch)" if "undefined symbol" in str(err) else ""


def mmcv_built_for() -> str | None:
    """The torch build mmcv's ops were compiled against, when drivebench's installer built them: the
    wheel it installed from (PEP 610 ``direct_url.json``) sits in ``wheels/<py>-torch<version>-<ops>/``."""
    import json

    try:
        text = importlib.metadata.distribution("mmcv").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    url = urllib.parse.unquote(json.loads(text).get("url", "")) if text else ""
    match = re.search(r"/cp\d+-torch([^/]+)-(cpu|cuda[\d.]+)/mmcv-[^/]+\.whl$", url)
    return f"torch {match.group(1)} ({match.group(2)} ops)" if match else None


def _op_names(ext: object) -> list[str]:
    """Compiled op functions of ``mmcv._ext``, grouped (``roi_align_forward``/``_backward`` -> ``roi_align``)."""
    names = [n for n in dir(ext) if not n.startswith("_")]
    return sorted({re.sub(r"_(forward|backward)(_cpu|_cuda)?$", "", n) for n in names})


def _cpu_ops_run(ops: object) -> list[str]:
    """Ops that really run on CPU tensors here (a tiny call each): what LiDAR detectors need first."""
    import torch

    ran = []
    try:
        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.1, 0.1, 1.1, 1.1], [5.0, 5.0, 6.0, 6.0]])
        ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
        ran.append("nms")
    except Exception:
        pass
    try:
        points = torch.rand(64, 4) * 4
        ops.Voxelization(voxel_size=[1.0, 1.0, 4.0], point_cloud_range=[0, 0, 0, 4, 4, 4], max_num_points=8,
                         max_voxels=32)(points)
        ran.append("voxelization")
    except Exception:
        pass
    return ran


def mmcv_check(ctx: DoctorContext) -> CheckResult:
    """mmcv: installed? full build with compiled ops (``mmcv._ext``) or mmcv-lite? which ops, built for
    which torch and CUDA, and do they run on the CPU?"""
    version = installed_version("mmcv") or installed_version("mmcv-full") or installed_version("mmcv-lite")
    module, err = import_or_error("mmcv")
    if module is None:
        if is_absent(err, "mmcv"):
            return informed(ABSENT + "; model=mmdet3d needs it: python -m drivebench.openmmlab.install")
        return failed(f"mmcv {version} is installed but does not import: {error_text(err)}",
                      "reinstall mmcv for this torch (or `pip uninstall mmcv`: drivebench does not need it)",
                      {"mmcv": version})
    version = getattr(module, "__version__", version)
    data: dict = {"mmcv": version, "ops": False, "compiler": None, "compiled_cuda": None}
    ext, err = import_or_error("mmcv._ext")
    rebuild = (f"rebuild mmcv against {_torch_build()}: `python -m drivebench.openmmlab.install --rebuild` "
               f"(MMCV_WITH_OPS=1, setuptools<70, C++20 for torch>=2.14; cached wheel), or by hand `pip install "
               f"setuptools<70 wheel && MMCV_WITH_OPS=1 pip install --no-build-isolation --no-binary mmcv "
               f"mmcv=={version}`; drivebench's own models do not need mmcv")
    if ext is None:
        if is_absent(err, "mmcv._ext"):
            return informed(f"mmcv {version} without compiled ops (mmcv-lite or a build without MMCV_WITH_OPS): "
                            "mmcv.ops and mmdet3d's models will not import",
                            "only needed for upstream OpenMMLab code (model=mmdet3d): " + rebuild, data)
        return failed(f"mmcv {version}: compiled ops do not load{_abi_hint(err)}: {error_text(err)}", rebuild, data)
    data["ops"] = True
    names = _op_names(ext)
    data.update(op_functions=len([n for n in dir(ext) if not n.startswith("_")]), op_names=names,
                built_for=mmcv_built_for())
    ops, _ = import_or_error("mmcv.ops")
    for key, getter in (("compiler", "get_compiler_version"), ("compiled_cuda", "get_compiling_cuda_version")):
        try:
            data[key] = str(getattr(ops, getter)())
        except Exception:  # older/newer mmcv without the helper, or ops not importable
            data[key] = None
    data["cpu_ops_run"] = _cpu_ops_run(ops) if ops is not None else []
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    saw = (f"mmcv {version} with {len(names)} compiled ops ({shown}); built for "
           f"{data['built_for'] or 'an unrecorded torch (not by drivebench.openmmlab.install)'}, compiler "
           f"{data['compiler'] or 'unknown'}, CUDA {data['compiled_cuda'] or 'unknown'}; run on CPU: "
           f"{', '.join(data['cpu_ops_run']) or 'none'}; running {_torch_build()}")
    torch_cuda = _torch_cuda()
    compiled = data["compiled_cuda"]
    if compiled and compiled != "not available" and torch_cuda and \
            version_tuple(compiled)[:1] != version_tuple(torch_cuda)[:1]:
        return warned(saw + f": ops built for CUDA {compiled}, torch uses CUDA {torch_cuda}", rebuild, data)
    built = re.match(r"torch (\S+) ", data["built_for"] or "")
    running = _torch_version()
    if built and running and built.group(1) != running:
        return warned(saw + f": built for torch {built.group(1)}, running {running}", rebuild, data)
    if compiled == "not available" and _torch_cuda_available():
        return warned(saw + ": this machine has a GPU but mmcv has CPU ops only (mmcv ops on CUDA tensors fail)",
                      rebuild, data)
    return passed(saw, data)


def _torch_version() -> str | None:
    try:
        import torch

        return torch.__version__
    except Exception:
        return None


def _torch_cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _torch_cuda() -> str | None:
    try:
        import torch

        return torch.version.cuda
    except Exception:
        return None


def flash_attn_check(ctx: DoctorContext) -> CheckResult:
    """flash-attn: imports against this torch? (an "undefined symbol" ImportError is the ABI mismatch)"""
    version = installed_version("flash-attn") or installed_version("flash_attn")
    module, err = import_or_error("flash_attn")
    if module is None:
        if is_absent(err, "flash_attn"):
            return informed(ABSENT + "; drivebench uses torch's scaled_dot_product_attention")
        remedy = (f"reinstall a flash-attn built for {_torch_build()}: `pip install flash-attn --no-build-isolation` "
                  "(compiles against the installed torch), or `pip uninstall flash-attn` and use torch's SDPA "
                  "(torch.nn.functional.scaled_dot_product_attention), which drivebench does")
        name = f"flash-attn {version}" if version else "flash-attn"
        return failed(f"{name} does not import{_abi_hint(err)}: {error_text(err)}", remedy,
                      {"flash_attn": version, "error": error_text(err)})
    version = getattr(module, "__version__", version)
    return passed(f"flash-attn {version} imports against {_torch_build()}", {"flash_attn": version})


def spconv_check(ctx: DoctorContext) -> CheckResult:
    """spconv (sparse convolution): imports? which CUDA build (from its wheel name)?"""
    dists = sorted({d.metadata["Name"] for d in distributions() if (d.metadata["Name"] or "").startswith("spconv")})
    module, err = import_or_error("spconv.pytorch")
    if module is None:
        if is_absent(err, "spconv.pytorch") and not dists:
            return informed(ABSENT + "; GaussianFormer's sparse conv is written in plain PyTorch here")
        return failed(f"spconv ({', '.join(dists) or 'unknown wheel'}) does not import{_abi_hint(err)}: "
                      f"{error_text(err)}",
                      "install the spconv wheel for torch's CUDA (e.g. `pip install spconv-cu120` for CUDA 12.x) with "
                      "a matching cumm, or uninstall it: drivebench does not need it", {"wheels": dists})
    root, _ = import_or_error("spconv")
    version = getattr(root, "__version__", None)
    wheel_cuda = next((d.split("-cu", 1)[1] for d in dists if "-cu" in d), None)
    wheel_major = int(wheel_cuda[:-1]) if wheel_cuda and wheel_cuda.isdigit() and len(wheel_cuda) >= 3 else None
    torch_cuda = _torch_cuda()
    data = {"spconv": version, "wheels": dists, "wheel_cuda": wheel_cuda, "torch_cuda": torch_cuda}
    saw = f"spconv {version} ({', '.join(dists) or 'no wheel metadata'})"
    torch_major = version_tuple(torch_cuda)[:1]
    if wheel_major is not None and torch_major and (wheel_major,) != torch_major:
        return warned(f"{saw}: built for CUDA {wheel_major}.x, torch uses CUDA {torch_cuda}",
                      f"install the spconv-cu{torch_major[0]}x wheel for CUDA {torch_major[0]} (e.g. spconv-cu120 "
                      "for CUDA 12) with its matching cumm", data)
    return passed(saw, data)


CHECKS = [
    Check("extensions.mmcv", mmcv_check),
    Check("extensions.flash_attn", flash_attn_check),
    Check("extensions.spconv", spconv_check),
]
