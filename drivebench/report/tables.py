"""The report's text outputs: ``report.csv`` (every column), ``report.md`` and the terminal table.

The markdown and terminal tables show formatted, unit-bearing columns and drop those that no run
filled (GPU figures on CPU-only runs, for instance); the CSV keeps every raw number.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from drivebench.report.analysis import BASELINE_SETTING, Target, target_column
from drivebench.report.convergence import SOONER_AIM
from drivebench.report.loading import Problem

_AUX_METRIC = re.compile(r"@|^d\d+\.")  # per-threshold and per-decoder-layer figures: CSV only


def fmt(value: Any, digits: int = 3, scale: float = 1.0, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (int, float)):
        return f"{value * scale:.{digits}g}{unit}"
    return str(value)


def _throughput(row: pd.Series) -> str:
    median = fmt(row["throughput_median"])
    if not median:
        return ""
    lo, hi = fmt(row["throughput_p10"]), fmt(row["throughput_p90"])
    return f"{median} [{lo}-{hi}]" if lo and hi else median


def _ckpt(row: pd.Series) -> str:
    total = fmt(row["ckpt_blocking_s_total"], unit=" s")
    saves = row["ckpt_saves"]
    if not total:
        return ""
    return f"{total} ({saves:.0f} saves)" if isinstance(saves, float) and not math.isnan(saves) else total


def _loss(row: pd.Series) -> str:
    first, final = fmt(row["loss_first"]), fmt(row["loss_final"])
    return f"{first} -> {final}" if first or final else ""


def _efficiency(row: pd.Series) -> str:
    """Above 100% only with its reason (the run's ``efficiency_note``)."""
    cell = fmt(row["efficiency"], scale=100, unit="%")
    note = row.get("efficiency_note")
    if cell and isinstance(note, str) and note:
        return f"{cell} ({note})"
    return cell


def _autotune(row: pd.Series) -> str:
    """accel=auto runs: the trial's cost (share of the run) and what it changed on its preset."""
    cost = fmt(row.get("autotune_cost_s"), unit=" s")
    if not cost:
        return ""
    share = fmt(row.get("autotune_cost_fraction"), scale=100, unit="%", digits=2)
    return f"{cost}" + (f" ({share})" if share else "") + f": {row.get('autotune_changed') or 'no change'}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _target_cell(row: pd.Series, target: Target) -> str:
    state = row.get(target_column(target, "state"))
    if state != "reached":
        return state or ""
    return f"step {row[target_column(target, 'steps')]:.0f}, {fmt(row[target_column(target, 'wall_s')], unit=' s')}"


# column title -> how to show it; the order is the table's order
MAIN_COLUMNS: dict[str, Callable[[pd.Series], str]] = {
    "machine": lambda r: r["machine"],
    "model": lambda r: f"{r['model']} ({r['model_size']})",
    "setting": lambda r: r["setting_key"],
    "samples/s median [p10-p90]": _throughput,
    "global samples/s (all ranks)": lambda r: fmt(r["global_samples_per_s"]),
    "speedup vs none": lambda r: fmt(r["speedup"], unit="x"),
    "data wait": lambda r: fmt(r["data_wait_fraction"], scale=100, unit="%"),
    "loop overhead + sync": lambda r: fmt(r["loop_overhead_fraction"], scale=100, unit="%"),
    "efficiency vs ceiling": _efficiency,
    "device span (CUDA events)": lambda r: fmt(r["device_busy_fraction"], scale=100, unit="%"),
    "GPU util (median)": lambda r: fmt(r["gpu_util_pct_median"], unit="%"),
    "peak memory": lambda r: fmt(r["peak_device_gb"], unit=" GiB"),
    "ckpt blocking": _ckpt,
    "loss first -> final": _loss,
    "bottleneck": lambda r: _text(r.get("bottleneck")),
    "accel trial (cost: chose)": _autotune,
    "kernels / step (profile)": lambda r: fmt(r.get("profile_kernels_per_step"), digits=4),
    "GPU active (profile)": lambda r: fmt(r.get("profile_gpu_active_fraction"), scale=100, unit="%"),
    "steps (warm-up)": lambda r: (f"{r['steps_measured']:.0f} ({r['warmup_steps']:.0f})"
                                  if not math.isnan(r["steps_measured"]) else ""),
    "run": lambda r: r["run"],
}


def main_table(runs: pd.DataFrame, targets: list[Target]) -> pd.DataFrame:
    """Formatted strings, one row per run; columns no run filled are dropped."""
    columns = dict(MAIN_COLUMNS)
    run_col = columns.pop("run")
    for target in targets:
        columns[f"to {target.label}"] = lambda r, t=target: _target_cell(r, t)
    columns["run"] = run_col
    table = pd.DataFrame({title: [show(row) for _, row in runs.iterrows()] for title, show in columns.items()})
    keep = [c for c in table.columns if (table[c] != "").any()]
    return table[keep]


def bottleneck_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run that has a verdict: verdict, evidence, next."""
    if "bottleneck" not in runs:
        return pd.DataFrame()
    part = runs[runs["bottleneck"].map(lambda v: isinstance(v, str) and bool(v))]
    return pd.DataFrame({"model": part["model"].astype(str) + " (" + part["model_size"].astype(str) + ")",
                         "setting": part["setting_key"], "bottleneck": part["bottleneck"],
                         "evidence": part["bottleneck_evidence"].map(_text), "next": part["bottleneck_next"].map(_text),
                         "run": part["run"]}).reset_index(drop=True)


def val_tables(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per model: validation metrics (headline ones; per-threshold/per-layer figures stay in the CSV)."""
    out = {}
    for model, part in runs.groupby("model", sort=False):
        cols = [c for c in part.columns if c.startswith("val/") and part[c].notna().any()
                and not _AUX_METRIC.search(c.removeprefix("val/"))]
        if not cols:
            continue
        table = pd.DataFrame({
            "machine": part["machine"], "size": part["model_size"], "setting": part["setting_key"],
            **{c.removeprefix("val/"): part[c].map(fmt) for c in cols}, "run": part["run"]})
        out[str(model)] = table.reset_index(drop=True)
    return out


def convergence_display(table: pd.DataFrame) -> pd.DataFrame:
    """A convergence table (``report.convergence.convergence_table``) as the report shows it."""
    def final(r: pd.Series) -> str:
        finals = r.get("finals", r["runs"])
        if finals == 0:
            return "- (every run stopped early)"
        if finals < 2:
            return fmt(r["final_mean"], digits=4)
        return f"{fmt(r['final_mean'], digits=4)} [{fmt(r['final_min'], digits=4)}-{fmt(r['final_max'], digits=4)}]"

    def to_target(r: pd.Series) -> str:
        wall = fmt(r["to_target_wall_s_median"], unit=" s")
        if wall:
            text = f"{wall}, step {r['to_target_steps_median']:.0f}"
            every = fmt(r.get("to_target_wall_s_median_all", math.nan), unit=" s")
            if r["runs_reached"] < r["runs"] and every:  # the ratio stands on the median over every run
                text += f" (over the {r['runs_reached']:.0f} that met it; over all {r['runs']:.0f}: {every})"
            return text
        never = "not reached before the stop" if r.get("stopped_before_target", 0) == r["runs"] else "not reached"
        trained = fmt(r.get("not_reached_by_s", math.nan), unit=" s")
        return f"{never} (in {trained})" if trained else never

    def reached(r: pd.Series) -> str:
        notes = []
        first, cut = r.get("reached_at_first_validation", 0), r.get("stopped_before_target", 0)
        if first and first > 0:
            notes.append(f"{first:.0f} at the first validation")
        if cut and cut > 0:
            notes.append(f"{cut:.0f} stopped before it")
        resumed = r.get("resumed", 0)
        if resumed and resumed > 0:
            notes.append(f"{resumed:.0f} resumed, times summed over processes")
        return f"{r['reached']} ({'; '.join(notes)})" if notes else str(r["reached"])

    def vs_none(r: pd.Series) -> str:
        median = fmt(r["wall_s_vs_none"], unit="x")
        low, high = fmt(r.get("wall_s_vs_none_min", math.nan)), fmt(r.get("wall_s_vs_none_max", math.nan))
        bound = r.get("wall_s_vs_none_bound")
        if bound in ("at least", "at most"):  # some runs never met it: one side of the ratio only
            pairs = low if bound == "at least" else high  # compared as shown: one pair prints its figure once
            return (f"{bound} {median} [pairs: {bound} {pairs}x]" if median and pairs and pairs + "x" != median
                    else f"{bound} {median}" if median else "")
        if median and bool(low) != bool(high):  # the medians known, the pairs with a run that never met it bounded
            return f"{median} [pairs: at least {low}x]" if low else f"{median} [pairs: at most {high}x]"
        return f"{median} [{low}-{high}]" if median and low and high and low != high else median

    def compiling(r: pd.Series) -> str:
        seconds = fmt(r.get("compile_s_median", math.nan), unit=" s")
        cache = r.get("compile_cache")
        return f"{seconds} ({cache} cache)" if seconds and isinstance(cache, str) and cache else seconds or "-"

    def pace(r: pd.Series) -> str:
        first = fmt(r.get("first_validation_s_median", math.nan), unit=" s")
        between = fmt(r.get("between_validations_s_median", math.nan), unit=" s")
        if not (first and between):
            return first or "-"
        ratio = fmt(r.get("between_validations_vs_none", math.nan), unit="x")
        if not ratio or r["setting"] == BASELINE_SETTING:
            return f"{first}, then every {between}"
        k = r.get("validations_for_aim", math.nan)
        aim = (f"{SOONER_AIM:g}x from validation {k:.0f} on" if math.isfinite(k)
               else f"under {SOONER_AIM:g}x on any longer schedule")
        return f"{first}, then every {between} ({ratio}; {aim})"

    def validating(r: pd.Series) -> str:
        first = fmt(r.get("validation_first_s_median", math.nan), unit=" s")
        each = fmt(r.get("validation_s_median", math.nan), unit=" s")
        return f"first {first}, then {each} each" if first and each else first or "-"

    def same_as_none(r: pd.Series) -> str:
        """This machine's verdict, and where other machines add finals, the verdict over all of them."""
        verdict = str(r["same_as_none"])
        pooled, base = r.get("finals_every_machine", math.nan), r.get("none_finals_every_machine", math.nan)
        if r["setting"] == BASELINE_SETTING or pooled != pooled or base != base:
            return verdict
        if pooled == r.get("finals") and base == r.get("none_finals"):  # no other machine adds a final
            return verdict
        return f"{verdict}; over every machine ({base:.0f} none, {pooled:.0f} this): {r['same_as_none_every_machine']}"

    def at_equal_steps(r: pd.Series) -> str:
        """How far behind none the metric is at the validation steps both logged, with none's seed spread there;
        over every machine too where other machines add runs."""
        def gap(value: float, spread: float) -> str:
            side = "behind" if value > 0 else "ahead"
            spread_text = fmt(spread, digits=3)
            return (f"{fmt(abs(value), digits=3)} {side} "
                    + (f"(none's seed spread {spread_text})" if spread_text else "(one none run: no spread)"))

        value = r.get("behind_none_at_equal_steps", math.nan)
        if r["setting"] == BASELINE_SETTING or value != value:
            return "-"
        text = f"{gap(value, r.get('none_spread_at_equal_steps', math.nan))} over {r['equal_steps']:.0f} validations"
        runs, base = r.get("runs_every_machine", math.nan), r.get("none_runs_every_machine", math.nan)
        pooled = r.get("behind_none_at_equal_steps_every_machine", math.nan)
        if pooled == pooled and (runs != r["runs"] or base != r.get("none_runs")):
            spread = r.get("none_spread_at_equal_steps_every_machine", math.nan)
            text += f"; over every machine ({base:.0f} none, {runs:.0f} this): {gap(pooled, spread)}"
        return text

    return pd.DataFrame({
        "machine": table["machine"], "model": table["model"].astype(str) + " (" + table["model_size"].astype(str) + ")",
        "setting": table["setting"], "seeds": table["seeds"],
        "final (mean [min-max])": [final(r) for _, r in table.iterrows()],
        "seed spread": table["final_spread"].map(lambda v: fmt(v, digits=3)),
        "reached": [reached(r) for _, r in table.iterrows()],
        "to target (median over seeds)": [to_target(r) for _, r in table.iterrows()],
        "of which compiling": [compiling(r) for _, r in table.iterrows()],
        "time to target, none / this [over pairs of runs]": [vs_none(r) for _, r in table.iterrows()],
        "first validation, then between validations (none / this)": [pace(r) for _, r in table.iterrows()],
        "of which validating": [validating(r) for _, r in table.iterrows()],
        "final within the seed spread of none": [same_as_none(r) for _, r in table.iterrows()],
        "metric at equal steps, this vs none (mean over validations)": [at_equal_steps(r) for _, r in table.iterrows()],
    }).reset_index(drop=True)


def to_markdown(table: pd.DataFrame) -> str:
    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in table.columns) + " |",
             "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def to_text(table: pd.DataFrame) -> str:
    """Aligned plain text for the terminal."""
    if table.empty:
        return ""
    widths = [max(len(str(c)), *(len(str(v)) for v in table[c])) for c in table.columns]
    def line(values: list[Any]) -> str:
        return "  ".join(str(v).ljust(w) for v, w in zip(values, widths)).rstrip()
    rule = "-" * len(line(list(table.columns)))
    body = [line(list(row)) for row in table.itertuples(index=False)]
    return "\n".join([rule, line(list(table.columns)), rule, *body, rule])


def machines_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per machine: its fingerprint as its first run recorded it, and how many runs it has."""
    first = runs.drop_duplicates("machine")
    return pd.DataFrame({
        "machine": first["machine"], "hostnames": first["machine"].map(
            runs.groupby("machine")["hostname"].agg(lambda h: ", ".join(sorted(set(map(str, h)))))),
        "CPU": first["cpu_model"], "cores": first["cpu_cores"].map(fmt), "RAM": first["ram_gb"].map(
            lambda v: fmt(v, unit=" GiB")), "torch": first["torch"], "CUDA": first["cuda"],
        "driver": first["driver"], "runs": first["machine"].map(runs["machine"].value_counts()),
    }).fillna("").reset_index(drop=True)


def problems_table(problems: list[Problem]) -> pd.DataFrame:
    return pd.DataFrame({
        "kind": [p.kind for p in problems],
        "model": [p.model or "" for p in problems],
        "accel": [p.accel or "" for p in problems],
        "run dir": [str(p.run_dir) for p in problems],
        "why": [p.reason for p in problems],
    })


def write_markdown(path: Path, runs: pd.DataFrame, targets: list[Target], problems: list[Problem],
                   warnings: list[str], plots: dict[str, Path], sources: list[Path],
                   convergence: dict[str, pd.DataFrame] | None = None) -> None:
    parts = ["# drivebench report", "",
             f"Runs read from: {', '.join(f'`{s}`' for s in sources)}. {len(runs)} completed run(s), "
             f"{len(problems)} not usable.", ""]
    convergence_sections = []
    for label, table in (convergence or {}).items():
        convergence_sections += [
            f"## Convergence: {label}", "",
            "Runs that validated during training. Final: the last validation's value, mean over the "
            "setting's seeds [min-max]; seed spread: max - min. To target: the first validation that "
            "met it, median over the seeds that reached it (wall time since training began). The "
            "final metric is within the seed spread of none when the two means differ by at most the "
            "larger spread of the two settings (needs two seeds of each). A run stopped by a signal before "
            "its schedule ended counts with the validations it logged: its time to target if it met it "
            "before the stop, no final metric. A run that met the target at its first validation took as "
            "long as its first epoch, whatever it learnt: a target every run meets there does not compare "
            "convergence.", "",
            to_markdown(convergence_display(table)), ""]
    if runs.empty:
        parts += convergence_sections
    if not runs.empty:
        parts += ["## Runs", "",
                  "Throughput: samples/s of one process, median over the measured steps (warm-up excluded) "
                  "with the 10th-90th percentile. Speedup: median throughput over the `accel=none` run of the "
                  "same model, size and machine. Data wait: share of step time spent waiting for the loader. "
                  "Efficiency: training throughput over the ceiling (the same model on one batch resident on "
                  "the device). Setting: the accel preset or ablation step, then any `accel.*` knob the run "
                  "overrode.", "", to_markdown(main_table(runs, targets)), ""]
        verdicts = bottleneck_table(runs)
        if not verdicts.empty:
            parts += ["## Bottlenecks", "", "What bounds each run's step, the numbers that decided it and the knob "
                      "to try next (rules and thresholds: docs/summary.md).", "", to_markdown(verdicts), ""]
        parts += convergence_sections
        for model, table in val_tables(runs).items():
            parts += [f"## Validation: {model}", "", to_markdown(table), ""]
        parts += ["## Machines", "", to_markdown(machines_table(runs)), ""]
    if problems:
        parts += ["## Runs that did not complete", "", to_markdown(problems_table(problems)), ""]
    if warnings:
        parts += ["## Warnings", "", *[f"- {w}" for w in warnings], ""]
    if plots:
        parts += ["## Plots", ""]
        parts += [f"![{name}]({p.name})" for name, p in plots.items()]
        parts.append("")
    path.write_text("\n".join(parts))


def write_csv(path: Path, runs: pd.DataFrame) -> None:
    runs.to_csv(path, index=False)
