"""Scaling over the GPUs of one host (``+experiment=scaling``): throughput and efficiency against devices.

A run counts here when its summary recorded ``experiment.name: scaling``. Its devices are its world
size (``settings.global_batch_size / settings.batch_size``), its P2P setting ``dist.p2p.applied``.
A series is one kind of machine (hardware label and machine profile: a pool of identical hosts is
one machine, whichever host ran a job), model, size, data and batch rule (``per_device`` at one
per-device batch, or ``global`` at one global batch); in it, one line per P2P setting.

- **Throughput** of a job: the median over its measured steps of rank 0's per-step samples/s, times
  the world size (DDP's all-reduce keeps the ranks in step, so every rank steps at rank 0's pace),
  with the p10-p90 spread scaled the same way. ``global samples/s (wall)`` beside it is all ranks'
  samples over the slowest rank's wall time (``ranks.global_samples_per_s``), the cross-check.
- **Efficiency** at N devices: N-device throughput / (N x 1-device throughput). The 1-device
  throughput is the median over the series' 1-device jobs of every P2P setting: with one device P2P
  has nothing to act on, so each line starts from the same point.
- **Bus bandwidth**: a ``doctor*.json`` (``drivebench doctor doctor.json=...``) among the folders,
  written on the same host as the series' runs (else on a machine of the same GPUs, count and
  driver, which the table then names), gives the NCCL all-reduce bus bandwidth the doctor measured
  between GPU pairs with P2P on and off (median and minimum over the pairs) and its P2P verdict. The
  doctor measures pairs (2-GPU all-reduces of 64 MiB), not the 4- and 8-GPU rings of the jobs.

Jobs the machine could not hold (``run.status: skipped``) are listed by their reason.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd

from drivebench.report.labels import hardware_label
from drivebench.report.loading import SKIPPED, Problem
from drivebench.report.tables import fmt, to_markdown, to_text

EXPERIMENT = "scaling"
SERIES = ["hardware", "machine_profile", "model", "model_size", "data", "experiment_batch", "_batch"]
DOCTOR_TOOL = "drivebench.doctor"
ALLREDUCE_CHECK = "gpu.allreduce"
TARGET_EFFICIENCY = 0.9  # issue 22: MLPerf-class single-host scaling at 8 GPUs, P2P on
COLUMNS = ["series", "devices", "p2p", "batch_per_device", "global_batch", "samples_per_s", "samples_per_s_p10",
           "samples_per_s_p90", "efficiency", "global_samples_per_s_wall", "step_s_median", "data_wait_max_rank",
           "busbw_gbs_median", "busbw_gbs_min", "doctor_verdict", "doctor_host", "hosts", "runs"]


@dataclass
class DoctorRecord:
    """The doctor's all-reduce measurement on one host, from its ``doctor.json``."""

    path: Path
    hostname: str | None
    hardware: str
    driver: str | None
    verdict: str | None
    busbw: dict[str, list[float]] = field(default_factory=dict)  # "on" / "off" -> bus GB/s per GPU pair

    def bandwidth(self, p2p: str) -> tuple[float, float]:
        """(median, min) over the pairs for a P2P setting: ``on``/``off`` (a level reads as on)."""
        values = self.busbw.get("off" if p2p == "off" else "on") or []
        return (median(values), min(values)) if values else (math.nan, math.nan)


def _world(runs: pd.DataFrame) -> pd.Series:
    ratio = runs["global_batch_size"] / runs["batch_size"]
    return ratio.round()


def scaling_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``+experiment=scaling`` that measured training, with ``devices`` and their series."""
    if runs.empty or "experiment" not in runs:
        return pd.DataFrame()
    part = runs[(runs["experiment"] == EXPERIMENT) & runs["throughput_median"].notna()].copy()
    if part.empty:
        return part
    part["devices"] = _world(part)
    part = part[part["devices"].notna() & (part["devices"] >= 1)]
    part["devices"] = part["devices"].astype(int)
    part["p2p"] = part["p2p"].fillna("-").astype(str)
    part["experiment_batch"] = part["experiment_batch"].fillna("per_device")
    part["_batch"] = part["batch_size"].where(part["experiment_batch"] != "global", part["global_batch_size"])
    scale = part["devices"].astype(float)
    part["global_median"] = part["throughput_median"] * scale
    part["global_p10"] = part["throughput_p10"] * scale
    part["global_p90"] = part["throughput_p90"] * scale
    # one device: all its samples are the job's (ranks.global_samples_per_s exists for 2 ranks or more)
    part["global_samples_per_s"] = part["global_samples_per_s"].where(part["devices"] > 1, part["samples_per_s"])
    order = part.assign(_job=part["job_num"].fillna(math.inf)).sort_values(["_job", "started"], kind="stable",
                                                                          na_position="last")
    return order.drop(columns="_job")  # in launch order: series and P2P lines appear as the sweep ran them


def series_label(row: pd.Series) -> str:
    batch = (f"global batch {row['global_batch_size']:.0f}" if row["experiment_batch"] == "global"
             else f"batch {row['batch_size']:.0f} per device")
    profile = row.get("machine_profile")
    where = f" [{profile}]" if isinstance(profile, str) and profile not in ("", "local") else ""
    return f"{row['model']} ({row['model_size']}), {batch}, {row['hardware']}{where}"


# ---- the doctor's records -------------------------------------------------------------------------
def find_doctor_records(dirs: list[Path]) -> list[DoctorRecord]:
    """Every ``doctor*.json`` at or below ``dirs`` written by ``drivebench doctor`` with an all-reduce check."""
    out: list[DoctorRecord] = []
    seen: set[Path] = set()
    for root in dirs:
        for dirpath, dirnames, files in os.walk(root, followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("tb", "checkpoints")]
            for name in files:
                path = Path(dirpath) / name
                if name.startswith("doctor") and name.endswith(".json") and path.resolve() not in seen:
                    seen.add(path.resolve())
                    record = read_doctor_record(path)
                    if record is not None:
                        out.append(record)
    return out


def read_doctor_record(path: Path) -> DoctorRecord | None:
    """A doctor.json's all-reduce pairs (None for another file, or a doctor run that did not measure them)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    header = data.get("header") if isinstance(data, dict) else None
    if not isinstance(header, dict) or header.get("tool") != DOCTOR_TOOL:
        return None
    check = next((c for c in data.get("checks") or [] if isinstance(c, dict) and c.get("check") == ALLREDUCE_CHECK),
                 None)
    pairs = ((check or {}).get("data") or {}).get("pairs") or []
    busbw: dict[str, list[float]] = {"on": [], "off": []}
    for pair in pairs:
        for side in ("on", "off"):
            value = pair.get(f"{side}_busbw_gbs") if isinstance(pair, dict) else None
            if pair.get(f"{side}_ok") and isinstance(value, (int, float)) and math.isfinite(value):
                busbw[side].append(float(value))
    if not busbw["on"] and not busbw["off"]:
        return None
    machine = header.get("machine") if isinstance(header.get("machine"), dict) else {}
    return DoctorRecord(path=path, hostname=machine.get("hostname"), hardware=hardware_label(machine),
                        driver=machine.get("driver"), verdict=((check or {}).get("data") or {}).get("verdict"),
                        busbw=busbw)


def doctor_for(part: pd.DataFrame, records: list[DoctorRecord]) -> DoctorRecord | None:
    """The record of the host that ran these jobs, else of a machine with the same GPUs and driver."""
    hosts = set(part["hostname"].dropna().astype(str))
    same_host = [r for r in records if r.hostname in hosts]
    if same_host:
        return same_host[-1]
    drivers = set(part["driver"].dropna().astype(str))
    same_kind = [r for r in records if r.hardware in set(part["hardware"]) and (r.driver in drivers or not drivers)]
    return same_kind[-1] if same_kind else None


# ---- the table -------------------------------------------------------------------------------------
def scaling_table(runs: pd.DataFrame, doctors: list[DoctorRecord] | None = None) -> pd.DataFrame:
    """One row per (series, P2P setting, device count): medians over repeated jobs (columns: COLUMNS)."""
    part = scaling_runs(runs)
    if part.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for _, series in part.groupby(SERIES, dropna=False, sort=False):
        label = series_label(series.iloc[0])
        single = series[series["devices"] == 1]
        base = float(single["global_median"].median()) if not single.empty else math.nan
        doctor = doctor_for(series, doctors or [])
        for (p2p, devices), point in series.groupby(["p2p", "devices"], sort=False):
            throughput = float(point["global_median"].median())
            bw_median, bw_min = doctor.bandwidth(p2p) if doctor is not None and devices > 1 else (math.nan, math.nan)
            rows.append({
                "series": label, "devices": int(devices), "p2p": p2p,
                "batch_per_device": float(point["batch_size"].median()),
                "global_batch": float(point["global_batch_size"].median()),
                "samples_per_s": throughput,
                "samples_per_s_p10": float(point["global_p10"].median()),
                "samples_per_s_p90": float(point["global_p90"].median()),
                "efficiency": throughput / (devices * base) if base > 0 else math.nan,
                "global_samples_per_s_wall": float(point["global_samples_per_s"].median()),
                "step_s_median": float(point["step_s_median"].median()),
                "data_wait_max_rank": float(point["data_wait_fraction_max_rank"].fillna(
                    point["data_wait_fraction"]).median()),
                "busbw_gbs_median": bw_median, "busbw_gbs_min": bw_min,
                "doctor_verdict": doctor.verdict if doctor is not None else None,
                "doctor_host": doctor.hostname if doctor is not None else None,
                "hosts": ", ".join(sorted(set(point["hostname"].dropna().astype(str)))),
                "runs": " ".join(point["run"].astype(str)),
            })
    table = pd.DataFrame(rows, columns=COLUMNS)
    first = {key: i for i, key in enumerate(dict.fromkeys(zip(table["series"], table["p2p"])))}
    table["_line"] = [first[key] for key in zip(table["series"], table["p2p"])]
    return table.sort_values(["_line", "devices"], kind="stable").drop(columns="_line").reset_index(drop=True)


def scaling_display(table: pd.DataFrame) -> pd.DataFrame:
    """The scaling table as report.md and the terminal show it."""
    def throughput(r: pd.Series) -> str:
        lo, hi = fmt(r["samples_per_s_p10"]), fmt(r["samples_per_s_p90"])
        return f"{fmt(r['samples_per_s'])} [{lo}-{hi}]" if lo and hi else fmt(r["samples_per_s"])

    def busbw(r: pd.Series) -> str:
        if math.isnan(r["busbw_gbs_median"]):
            return ""
        return f"{r['busbw_gbs_median']:.0f} (min {r['busbw_gbs_min']:.0f}) GB/s"

    shown = pd.DataFrame({
        "series": table["series"], "devices": table["devices"].astype(str), "P2P": table["p2p"],
        "batch / device": table["batch_per_device"].map(fmt), "global batch": table["global_batch"].map(fmt),
        "samples/s, all devices (median step [p10-p90])": [throughput(r) for _, r in table.iterrows()],
        "efficiency (vs N x 1 device)": table["efficiency"].map(lambda v: fmt(v, scale=100, unit="%")),
        "samples/s (all ranks, wall)": table["global_samples_per_s_wall"].map(fmt),
        "step (median)": table["step_s_median"].map(lambda v: fmt(v, unit=" s")),
        "data wait (worst rank)": table["data_wait_max_rank"].map(lambda v: fmt(v, scale=100, unit="%")),
        "doctor all-reduce bus bw (pairs)": [busbw(r) for _, r in table.iterrows()],
        "host": table["hosts"], "run": table["runs"],
    })
    keep = [c for c in shown.columns if (shown[c] != "").any()]
    return shown[keep].reset_index(drop=True)


# ---- the figure -------------------------------------------------------------------------------------
def _line_label(p2p: str, rows: pd.DataFrame) -> str:
    bw = rows[rows["devices"] > 1]["busbw_gbs_median"].dropna()
    extra = f"; doctor: {bw.iloc[0]:.0f} GB/s all-reduce bus bw" if not bw.empty else ""
    return f"P2P {p2p}{extra}"


def scaling_figure(table: pd.DataFrame) -> Any:
    """Per series: throughput (with the linear ideal) and efficiency against devices, one line per P2P."""
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(table["series"]))
    fig, axes = plt.subplots(len(series), 2, figsize=(12.0, 3.9 * len(series)), squeeze=False, layout="constrained")
    for (ax_t, ax_e), label in zip(axes, series):
        part = table[table["series"] == label]
        single = part[part["devices"] == 1]
        base_t = float(single["samples_per_s"].median()) if not single.empty else math.nan
        devices = sorted(set(part["devices"]))
        lines = [p for p in dict.fromkeys(part["p2p"]) if (part[(part["p2p"] == p)]["devices"] > 1).any()] or \
            list(dict.fromkeys(part["p2p"]))
        for p2p in lines:
            rows = part[(part["p2p"] == p2p) & (part["devices"] > 1)]
            x = [1, *rows["devices"]] if not math.isnan(base_t) else list(rows["devices"])
            y_t = [base_t, *rows["samples_per_s"]] if not math.isnan(base_t) else list(rows["samples_per_s"])
            y_e = [100.0, *(rows["efficiency"] * 100)] if not math.isnan(base_t) else list(rows["efficiency"] * 100)
            err = None
            if not rows.empty:
                lo = [0.0, *(rows["samples_per_s"] - rows["samples_per_s_p10"]).clip(lower=0)]
                hi = [0.0, *(rows["samples_per_s_p90"] - rows["samples_per_s"]).clip(lower=0)]
                err = [lo, hi] if len(lo) == len(x) else None
            line = ax_t.errorbar(x, y_t, yerr=err, marker="o", capsize=3, linewidth=1.5,
                                 label=_line_label(p2p, part[part["p2p"] == p2p]))
            ax_e.plot(x, y_e, marker="o", linewidth=1.5, color=line[0].get_color(), label=f"P2P {p2p}")
        if not math.isnan(base_t):
            ax_t.plot(devices, [base_t * d for d in devices], linestyle="--", color="gray", linewidth=1,
                      label="linear (N x 1 device)")
        ax_e.axhline(100, color="gray", linestyle="--", linewidth=1)
        ax_e.axhline(TARGET_EFFICIENCY * 100, color="tab:red", linestyle=":", linewidth=1,
                     label=f"{TARGET_EFFICIENCY:.0%} target")
        for ax in (ax_t, ax_e):
            ax.set_xscale("log", base=2)
            ax.set_xticks(devices, [str(d) for d in devices])
            ax.set_xlabel("devices (DDP ranks on one host)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        ax_t.set_ylabel("samples/s, all devices\n(median step; bars p10-p90)")
        ax_t.set_title(f"Throughput: {label}", fontsize=9)
        ax_e.set_ylabel("scaling efficiency (%)\nN-device / (N x 1-device)")
        ax_e.set_title(f"Efficiency: {label}", fontsize=9)
        ax_e.set_ylim(0, max(110.0, float((part["efficiency"] * 100).max() or 0) + 10))
    return fig


# ---- the report's section ---------------------------------------------------------------------------
@dataclass
class ScalingSection:
    table: pd.DataFrame
    skipped: list[Problem]
    files: dict[str, Path] = field(default_factory=dict)
    doctors: list[DoctorRecord] = field(default_factory=list)

    def markdown(self) -> str:
        parts = ["## Scaling over devices", "",
                 "`+experiment=scaling` jobs. Samples/s, all devices: rank 0's median per-step throughput times the "
                 "world size (p10-p90 likewise); the wall figure beside it is all ranks' samples over the slowest "
                 "rank's wall time. Efficiency: N-device throughput / (N x the median 1-device throughput of the "
                 f"series). Target: {TARGET_EFFICIENCY:.0%} at 8 devices with P2P on. Data wait: the worst rank's "
                 "share of step time spent waiting for its loader. Doctor bus bandwidth: NCCL all-reduce between "
                 "GPU pairs on that host, median (min) over the pairs, with that P2P setting.", ""]
        if not self.table.empty:
            parts += [to_markdown(scaling_display(self.table)), ""]
        if self.doctors and not self.table["doctor_host"].notna().any():
            parts += [f"A doctor record was found ({', '.join(str(d.path) for d in self.doctors)}) but not from "
                      "the host (or GPUs and driver) of these runs: no bus bandwidth shown.", ""]
        verdicts = self.table.dropna(subset=["doctor_verdict"]).drop_duplicates("series")
        for _, r in verdicts.iterrows():
            parts += [f"- {r['series']}: the doctor's P2P verdict on {r['doctor_host']}: `dist.p2p={r['doctor_verdict']}`"]
        if not verdicts.empty:
            parts.append("")
        if self.skipped:
            parts += [f"{len(self.skipped)} job(s) skipped (listed with the runs that did not complete):", "",
                      *[f"- `{p.run_dir.name}`: {p.reason}" for p in self.skipped], ""]
        if "scaling.png" in self.files:
            parts += [f"![scaling]({self.files['scaling.png'].name})", ""]
        return "\n".join(parts)

    def text(self) -> str:
        lines = []
        if not self.table.empty:
            lines += ["scaling over devices:", to_text(scaling_display(self.table).drop(columns=["run"]))]
        lines += [f"skipped: {p.run_dir.name}: {p.reason}" for p in self.skipped]
        return "\n".join(lines)


def skipped_jobs(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.kind == SKIPPED]


def write_scaling(runs: pd.DataFrame, problems: list[Problem], dirs: list[Path], out: Path) -> ScalingSection | None:
    """``scaling.csv`` and ``scaling.png`` in ``out`` when the runs hold scaling jobs; None otherwise."""
    import matplotlib.pyplot as plt

    skipped = skipped_jobs(problems)
    doctors = find_doctor_records(dirs)
    table = scaling_table(runs, doctors)
    if table.empty and not skipped:
        return None
    section = ScalingSection(table=table, skipped=skipped, doctors=doctors)
    if not table.empty:
        section.files["scaling.csv"] = out / "scaling.csv"
        table.to_csv(section.files["scaling.csv"], index=False)
        fig = scaling_figure(table)
        section.files["scaling.png"] = out / "scaling.png"
        fig.savefig(section.files["scaling.png"], dpi=110)
        plt.close(fig)
    return section
