"""Family 2: optional native extensions (mmcv, flash-attn, spconv).

drivebench's models are plain PyTorch and need none of these; upstream code does, and their
builds are where environments break: a wheel compiled against another torch fails at import with
"undefined symbol: _ZN3c10..." (the C++ ABI of torch changed), mmcv-lite has no compiled ops at
all. Absent is INFO; installed but not loadable is FAIL, because anything importing it crashes.
"""

from __future__ import annotations

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


def mmcv_check(ctx: DoctorContext) -> CheckResult:
    """mmcv: installed? full build with compiled ops (``mmcv._ext``) or mmcv-lite? built for which CUDA?"""
    version = installed_version("mmcv") or installed_version("mmcv-full") or installed_version("mmcv-lite")
    module, err = import_or_error("mmcv")
    if module is None:
        if is_absent(err, "mmcv"):
            return informed(ABSENT)
        return failed(f"mmcv {version} is installed but does not import: {error_text(err)}",
                      "reinstall mmcv for this torch (or `pip uninstall mmcv`: drivebench does not need it)",
                      {"mmcv": version})
    version = getattr(module, "__version__", version)
    data = {"mmcv": version, "ops": False, "compiler": None, "compiled_cuda": None}
    ext, err = import_or_error("mmcv._ext")
    rebuild = (f"rebuild mmcv against {_torch_build()}: `pip install setuptools<70 wheel && MMCV_WITH_OPS=1 "
               f"pip install --no-build-isolation --no-binary mmcv mmcv=={version}` (or OpenMMLab's wheel index "
               "for this exact torch/CUDA); drivebench itself does not need mmcv")
    if ext is None:
        if is_absent(err, "mmcv._ext"):
            return informed(f"mmcv {version} without compiled ops (mmcv-lite or a build without MMCV_WITH_OPS): "
                            "mmcv.ops and mmdet3d's models will not import",
                            "only needed for upstream OpenMMLab code: " + rebuild, data)
        return failed(f"mmcv {version}: compiled ops do not load{_abi_hint(err)}: {error_text(err)}", rebuild, data)
    data["ops"] = True
    ops, _ = import_or_error("mmcv.ops")
    for key, getter in (("compiler", "get_compiler_version"), ("compiled_cuda", "get_compiling_cuda_version")):
        try:
            data[key] = str(getattr(ops, getter)())
        except Exception:  # older/newer mmcv without the helper, or ops not importable
            data[key] = None
    saw = (f"mmcv {version} with compiled ops (compiler {data['compiler'] or 'unknown'}, "
           f"CUDA {data['compiled_cuda'] or 'unknown'}); running {_torch_build()}")
    torch_cuda = _torch_cuda()
    compiled = data["compiled_cuda"]
    if compiled and compiled != "not available" and torch_cuda and \
            version_tuple(compiled)[:1] != version_tuple(torch_cuda)[:1]:
        return warned(saw + f": ops built for CUDA {compiled}, torch uses CUDA {torch_cuda}", rebuild, data)
    return passed(saw, data)


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
