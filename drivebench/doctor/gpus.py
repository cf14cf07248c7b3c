"""Family 3: the GPUs, and whether they can talk to each other.

The field report's worst day: DDP hanging in its first all-reduce because NCCL's peer-to-peer path
between two cards was broken, fixed by ``NCCL_P2P_DISABLE=1``. Every pair is tested in a child
process with a deadline (a hang becomes a FAIL line, not a hung doctor): the access the driver
reports, a verified device-to-device copy, and a timed NCCL all-reduce with P2P on and off. The
verdict is cached for ``dist.p2p=auto`` (see :mod:`drivebench.hardware.p2p`).
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

from drivebench.doctor.context import DoctorContext
from drivebench.doctor.probe import ProbeRun, error_text, probe_env, run_probe, try_import
from drivebench.doctor.result import Check, CheckResult, failed, informed, passed, warned
from drivebench.hardware import nvml
from drivebench.hardware.p2p import (
    PairMeasure,
    cache_path,
    cached_verdict_for,
    current_machine_key,
    recommend_p2p,
    write_verdict,
)

BUFFER_MIB = 64
COPY_STARTUP_S, COPY_PAIR_S = 120.0, 30.0
ALLREDUCE_STARTUP_S, ALLREDUCE_PAIR_S = 180.0, 45.0
MAX_HANGS = 2  # hung pairs after which the remaining pairs of a probe are not tried
P2P_ENV = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")  # removed for the "P2P on" run: NCCL's default


def _cuda_gpus() -> tuple[Any, int, str | None]:
    """``(torch, visible CUDA device count, why not)``."""
    torch, err = try_import("torch")
    if torch is None:
        return None, 0, f"torch does not import ({err})"
    try:
        return torch, (torch.cuda.device_count() if torch.cuda.is_available() else 0), None
    except Exception as err:
        return torch, 0, error_text(err)


def _arch_supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """A cubin for sm_XY runs on sm_XZ with Z >= Y; PTX (compute_XY) JIT-compiles for any newer GPU."""
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        digits = "".join(ch for ch in digits if ch.isdigit())
        if len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return not arch_list  # an empty list: torch could not say; do not guess


def gpu_inventory(ctx: DoctorContext) -> CheckResult:
    """GPU count, model, memory, compute capability, and whether this torch has kernels for them."""
    torch, count, why = _cuda_gpus()
    listed = nvml.device_count()
    if count == 0:
        if listed:
            return failed(f"the driver lists {listed} GPU(s) but torch sees none ({why or 'cuda not available'}; "
                          f"CUDA_VISIBLE_DEVICES={_visible()})",
                          "install a CUDA build of torch that this driver supports, or fix CUDA_VISIBLE_DEVICES",
                          {"driver_gpus": listed})
        return informed("no GPU: runs use the CPU" + (f" ({why})" if why else ""), "", {"gpus": []})
    arch_list = torch.cuda.get_arch_list()
    gpus, unsupported = [], []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        cap = (props.major, props.minor)
        gpus.append({"index": i, "name": props.name, "memory_gb": round(props.total_memory / 2**30, 1),
                     "capability": f"{cap[0]}.{cap[1]}"})
        if not _arch_supported(cap, arch_list):
            unsupported.append(f"cuda:{i} {props.name} (sm_{cap[0]}{cap[1]})")
    summary = "; ".join(f"cuda:{g['index']} {g['name']} {g['memory_gb']} GiB sm_{g['capability'].replace('.', '')}"
                        for g in gpus)
    data = {"gpus": gpus, "arch_list": arch_list, "accelerator": ctx.machine.accelerator}
    if unsupported:
        return failed(f"{summary}; torch {torch.__version__} has no kernels for {', '.join(unsupported)} "
                      f"(built for {' '.join(arch_list)})",
                      "install a torch build whose CUDA version supports this GPU generation", data)
    if ctx.machine.accelerator != "cuda":
        return informed(f"{summary}; machine.accelerator={ctx.select('machine.accelerator')}: the run uses the CPU",
                        "machine.accelerator=auto uses the GPUs", data)
    return passed(f"{count} GPU(s): {summary}", data)


def _visible() -> str:
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")


def _pairs(count: int) -> list[tuple[int, int]]:
    return list(itertools.combinations(range(count), 2))


def _pair_arg(pairs: list[tuple[int, int]]) -> str:
    return ",".join(f"{a}-{b}" for a, b in pairs)


def _run_pairs(module: str, pairs: list[tuple[int, int]], base_args: list[str], env: dict[str, str],
               startup_s: float, pair_s: float, max_hangs: int = MAX_HANGS) -> dict[tuple[int, int], dict[str, Any]]:
    """Run a pair probe; when it hangs on a pair, mark that pair and go on with the rest in a new probe.

    After ``max_hangs`` hung pairs the rest are marked ``skipped`` (each hang costs ``pair_s``).
    """
    results: dict[tuple[int, int], dict[str, Any]] = {}
    remaining = list(pairs)
    hangs = 0
    while remaining:
        if hangs >= max_hangs:
            for pair in remaining:
                results[pair] = {"error": f"not measured: gave up after {hangs} hung pairs", "skipped": True}
            break
        launch_env = dict(env)
        if "MASTER_PORT" in launch_env:  # a fresh rendezvous port per launch: a killed probe may hold the last one
            launch_env["MASTER_PORT"] = str(_free_port())
        run: ProbeRun = run_probe(module, [*base_args, "--pairs", _pair_arg(remaining)],
                                  timeout_s=startup_s + pair_s * len(remaining), env=launch_env, idle_timeout_s=pair_s)
        before = len(results)
        started = None
        for record in run.records:
            pair = tuple(record["pair"])
            if record.get("event") == "start":
                started = pair
            elif record.get("event") == "done":
                results[pair] = record
                started = None
        if started is not None:  # the probe hung or died inside this pair; the next probe skips it
            results[started] = {"error": ("hung: " if run.timed_out else "probe died: ") + run.failure(),
                                "hung": run.timed_out}
            hangs += int(run.timed_out)
        elif len(results) == before and not all(p in results for p in remaining):
            for pair in remaining:  # no progress at all: CUDA/NCCL start-up itself failed
                results[pair] = {"error": "probe failed before the first pair: " + run.failure()}
        remaining = [p for p in remaining if p not in results]
    return results


def p2p_access(ctx: DoctorContext) -> CheckResult:
    """Every GPU pair: P2P access reported by the driver, and a verified device-to-device copy with bandwidth."""
    torch, count, why = _cuda_gpus()
    if count < 2:
        return informed(f"{'no GPU' if count == 0 else 'one GPU'}: no GPU pair to test")
    pairs = _pairs(count)
    results = _run_pairs("drivebench.doctor._p2p_copy_probe", pairs, ["--mib", str(BUFFER_MIB)], probe_env(),
                         COPY_STARTUP_S, COPY_PAIR_S)
    lines, problems, data = [], [], {}
    for pair in pairs:
        r = results.get(pair, {})
        label = f"{pair[0]}-{pair[1]}"
        access = "P2P" if r.get("access_ab") and r.get("access_ba") else "no P2P"
        if "error" in r:
            problems.append(f"{label}: {r['error']}")
            lines.append(f"{label} {access}, copy FAILED")
        elif not r.get("correct"):
            problems.append(f"{label}: the copied data differ from the source")
            lines.append(f"{label} {access}, copy CORRUPT")
        else:
            lines.append(f"{label} {access}, copy {r['copy_gbs']:.0f} GB/s")
        data[label] = r
    saw = "; ".join(lines)
    if problems:
        make = failed if _forces_p2p(ctx) else warned
        return make(f"{saw}. {' | '.join(problems)}",
                    "device-to-device copies between these GPUs hang or corrupt data: a broken PCIe P2P path "
                    "(often ACS/IOMMU on the PCIe switch). Disable ACS / set iommu=pt in the BIOS/kernel, or run "
                    "DDP with dist.p2p=off (NCCL_P2P_DISABLE=1) and keep tensors from moving between GPUs in one "
                    "process; gpu.allreduce gives NCCL's view", data)
    return passed(saw, data)


def _forces_p2p(ctx: DoctorContext) -> bool:
    """This config runs DDP with P2P forced on (not auto, which follows the doctor's verdict)."""
    return ctx.select("dist.strategy") == "ddp" and str(ctx.select("dist.p2p", "auto")).lower() == "on"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _measure_allreduce(count: int, pairs: list[tuple[int, int]], p2p: bool) -> dict[tuple[int, int], dict[str, Any]]:
    extra = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}  # the port is picked per launch
    if not p2p:
        extra["NCCL_P2P_DISABLE"] = "1"
    env = probe_env(extra, drop=P2P_ENV)
    return _run_pairs("drivebench.doctor._allreduce_probe", pairs, ["--world", str(count), "--mib", str(BUFFER_MIB)],
                      env, ALLREDUCE_STARTUP_S, ALLREDUCE_PAIR_S)


def _pair_measure(pair: tuple[int, int], on: dict[str, Any], off: dict[str, Any], level: str | None) -> PairMeasure:
    def outcome(r: dict[str, Any]) -> tuple[bool | None, float | None, str | None]:
        if r.get("skipped"):
            return None, None, r["error"]
        if "error" in r:
            return False, None, r["error"]
        if not r.get("correct", False):
            return False, r.get("busbw_gbs"), "wrong all-reduce result"
        return True, r.get("busbw_gbs"), None

    on_ok, on_bw, on_err = outcome(on)
    off_ok, off_bw, off_err = outcome(off)
    return PairMeasure(pair[0], pair[1], level, on_ok, on_bw, on_err, off_ok, off_bw, off_err)


def _pair_levels(pairs: list[tuple[int, int]]) -> dict[tuple[int, int], dict[str, Any] | None]:
    uuids = {i: nvml.cuda_device_uuid(i) for i in {i for pair in pairs for i in pair}}
    return {(a, b): (nvml.pair_link(uuids[a], uuids[b]) if uuids[a] and uuids[b] else None) for a, b in pairs}


def nccl_allreduce(ctx: DoctorContext) -> CheckResult:
    """Every GPU pair: NCCL all-reduce (64 MB) with P2P on and with NCCL_P2P_DISABLE=1; the P2P verdict, cached."""
    torch, count, why = _cuda_gpus()
    if count < 2:
        return informed(f"{'no GPU' if count == 0 else 'one GPU'}: no all-reduce between GPUs to test")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return failed("torch was built without NCCL: multi-GPU DDP cannot use the GPUs' links",
                      "install an official CUDA wheel of torch (it bundles NCCL)")
    pairs = _pairs(count)
    links = _pair_levels(pairs)
    on = _measure_allreduce(count, pairs, p2p=True)
    off = _measure_allreduce(count, pairs, p2p=False)
    missing = {"error": "not measured", "skipped": True}
    measures = [_pair_measure(p, on.get(p, missing), off.get(p, missing),
                              (links.get(p) or {}).get("nccl_level")) for p in pairs]
    verdict = recommend_p2p(measures)
    key = current_machine_key()
    data: dict[str, Any] = {"verdict": verdict.value, "reason": verdict.reason, "machine_key": key,
                            "pairs": [m.__dict__ for m in measures],
                            "links": {f"{a}-{b}": v for (a, b), v in links.items()}}
    if key is not None and verdict.value is not None:
        try:
            data["cache"] = str(write_verdict(ctx.cache_root, key, verdict, measures,
                                              {"nccl": ctx.machine.nccl, "buffer_mib": BUFFER_MIB}))
        except OSError as err:
            data["cache_error"] = error_text(err)
    lines = [f"{m.label} ({(links.get((m.a, m.b)) or {}).get('link', '?')}): P2P on "
             f"{_bw(m.on_ok, m.on_busbw_gbs, m.on_error)}, off {_bw(m.off_ok, m.off_busbw_gbs, m.off_error)}"
             for m in measures]
    saw = "; ".join(lines) + f". Verdict: dist.p2p={verdict.value} ({verdict.reason})"
    if "cache" in data:
        saw += f"; cached in {data['cache']}"
    if verdict.dead_pairs:
        return failed(saw, f"NCCL fails between GPUs {', '.join(verdict.dead_pairs)} even without P2P: rerun with "
                           "NCCL_DEBUG=INFO to see the transport it picks; check the driver, /dev/shm size and "
                           "that both GPUs are healthy (nvidia-smi -q)", data)
    if verdict.value == "on":
        return passed(saw, data)
    remedy = (f"run DDP with dist.p2p={verdict.value} "
              f"({'NCCL_P2P_DISABLE=1' if verdict.value == 'off' else 'NCCL_P2P_LEVEL=' + verdict.value}); "
              "dist.p2p=auto reads this cached verdict")
    if _forces_p2p(ctx):
        return failed(saw + "; this config sets dist.p2p=on, which would hang or crawl", remedy, data)
    return warned(saw, remedy, data)


def _bw(ok: bool | None, busbw: float | None, error: str | None) -> str:
    if ok:
        return f"{busbw:.0f} GB/s"
    if ok is None:
        return error or "not measured"
    return f"FAILED ({error})" if error else "FAILED"


def _cached_p2p_note(ctx: DoctorContext) -> str:
    value = cached_verdict_for(ctx.cache_root, current_machine_key())
    return f"cached verdict: dist.p2p={value} ({cache_path(ctx.cache_root)})" if value else "no cached P2P verdict"


CHECKS = [
    Check("gpu.inventory", gpu_inventory),
    Check("gpu.p2p_copy", p2p_access),
    Check("gpu.allreduce", nccl_allreduce, slow=True, when_skipped=_cached_p2p_note),
]
