"""Family 6: torch.compile works on each device type present (CPU always, CUDA when there is one).

Each smoke test runs in a child process with a deadline: inductor shells out to a C++ compiler on
the CPU and to Triton on CUDA, and either can fail (no compiler, a Triton that does not match
torch) or stall. A failure is FAIL when this config compiles on that device (``accel.compile``
resolved true there), WARN otherwise.
"""

from __future__ import annotations

import shutil
import tempfile

from drivebench.doctor.context import DoctorContext
from drivebench.doctor.probe import probe_env, run_probe, try_import
from drivebench.doctor.result import Check, CheckResult, failed, informed, passed, warned

COMPILE_TIMEOUT_S = 300.0
NUMERIC_TOLERANCE = 1e-3
REMEDIES = {
    "cpu": ("inductor's CPU backend compiles C++: install a compiler and Python headers (`apt-get install g++ "
            "python3-dev`, or point CXX at one), or set accel.compile=false"),
    "cuda": ("inductor's GPU backend generates Triton kernels: install the triton that this torch pins "
             "(`pip install --force-reinstall torch` brings it) and make sure a C compiler exists, "
             "or set accel.compile=false"),
}


def _compiles_there(ctx: DoctorContext, device: str) -> bool:
    return ctx.accel.compile and (ctx.machine.accelerator == "cuda") == (device == "cuda")


def _smoke_test(ctx: DoctorContext, device: str) -> CheckResult:
    args = ["--device", device] + (["--backward"] if device == "cuda" else [])
    with tempfile.TemporaryDirectory(prefix="drivebench-doctor-inductor-") as cache:
        env = probe_env({"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "TORCHINDUCTOR_CACHE_DIR": cache})
        run = run_probe("drivebench.doctor._compile_probe", args, timeout_s=COMPILE_TIMEOUT_S, env=env)
    record = run.records[-1] if run.records else None
    used = _compiles_there(ctx, device)
    data = {"device": device, "used_by_config": used, "probe_s": run.elapsed_s, **(record or {})}
    if device == "cpu":
        data["cxx"] = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if record is None or not record.get("ok"):
        error = record.get("error") if record else run.failure()
        make = failed if used else warned
        note = "" if used else " (this config does not compile on this device)"
        return make(f"torch.compile on {device} failed{note}: {error}", REMEDIES[device], data)
    passes = "forward + backward" if record.get("backward") else "forward"
    saw = (f"torch.compile of a tiny MLP on {device} with cold caches: first call (compile + {passes}) "
           f"{record['compile_s']:.1f} s, next call {record['second_call_s'] * 1e3:.1f} ms"
           + (f", triton {record['triton']}" if device == "cuda" and record.get("triton") else "")
           + f"; accel.compile={'on' if used else 'off'} here")
    if record.get("max_abs_diff", 0.0) > NUMERIC_TOLERANCE:
        return warned(saw + f": compiled output differs from eager by {record['max_abs_diff']:.2g}",
                      "report it with the torch version; set accel.compile=false for exact eager numerics", data)
    return passed(saw, data)


def compile_cpu(ctx: DoctorContext) -> CheckResult:
    """torch.compile (inductor) smoke test on the CPU, with compile time."""
    return _smoke_test(ctx, "cpu")


def compile_cuda(ctx: DoctorContext) -> CheckResult:
    """torch.compile (inductor + Triton) smoke test on the first GPU, with compile time."""
    torch, err = try_import("torch")
    if torch is None or not torch.cuda.is_available():
        return informed("no CUDA device: nothing to compile for")
    return _smoke_test(ctx, "cuda")


CHECKS = [
    Check("compile.cpu", compile_cpu, slow=True),
    Check("compile.cuda", compile_cuda, slow=True),
]
