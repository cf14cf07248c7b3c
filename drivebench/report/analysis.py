"""Compare runs: order of settings, speedup over the baseline, steps and time to a quality target.

Groups are (machine, model, model size, data, bench): a speedup is only ever taken between runs
of the same model and data on the same machine.
"""

from __future__ import annotations

import math

import pandas as pd

from drivebench.perf.targets import Target, parse_target  # noqa: F401 (the report's names for them)
from drivebench.report.events import CEILING

BASELINE_SETTING = "none"
GROUP = ["machine", "model", "model_size", "data", "bench"]
_PREFIXES = ("", "val/", "train/", "perf/")


# ---- ordering and baselines -----------------------------------------------------------------------
def order_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows by machine, model and size, then settings in sweep order (the baseline first)."""
    if runs.empty:
        return runs
    order = setting_order(runs)
    rank = {s: i for i, s in enumerate(order)}
    out = runs.assign(_rank=runs["setting"].map(rank), _job=runs["job_num"].fillna(math.inf))
    out = out.sort_values(["machine", "model", "model_size", "_rank", "_job", "started"], kind="stable",
                          na_position="last")
    return out.drop(columns=["_rank", "_job"]).reset_index(drop=True)


def setting_order(runs: pd.DataFrame) -> list[str]:
    """Settings as a sweep launched them (job number, then start time), ``none`` first."""
    by_launch = runs.assign(_job=runs["job_num"].fillna(math.inf)).sort_values(
        ["_job", "started"], kind="stable", na_position="last")
    seen = list(dict.fromkeys(by_launch["setting"]))
    if BASELINE_SETTING in seen:
        seen.remove(BASELINE_SETTING)
        seen.insert(0, BASELINE_SETTING)
    return seen


def add_speedup(runs: pd.DataFrame) -> pd.DataFrame:
    """``speedup``: median throughput over that of the ``accel=none`` run of the same group.

    Repeated baseline runs count by the median of their medians; no baseline leaves NaN.
    """
    if runs.empty:
        return runs.assign(speedup=pd.Series(dtype=float))
    base = (runs[runs["setting"] == BASELINE_SETTING].groupby(GROUP, dropna=False)["throughput_median"]
            .median().rename("_baseline").reset_index())
    out = runs.merge(base, on=GROUP, how="left")
    out["speedup"] = out["throughput_median"] / out["_baseline"]
    return out.drop(columns="_baseline")


def add_repeat_labels(runs: pd.DataFrame) -> pd.DataFrame:
    """``setting_key``: the setting, with ``#2``, ``#3`` for repeats within one group (plot labels)."""
    if runs.empty:
        return runs.assign(setting_key=pd.Series(dtype=str))
    nth = runs.groupby([*GROUP, "setting"], dropna=False).cumcount() + 1
    keys = [s if n == 1 else f"{s} #{n}" for s, n in zip(runs["setting"], nth)]
    return runs.assign(setting_key=keys)


def _plain(value: object) -> str:
    """A knob value as written in a config (pandas turns ``4`` into ``4.0`` and ``None`` into NaN)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "null"
        if value.is_integer():
            return str(int(value))
    return str(value)


def knob_changes(runs: pd.DataFrame) -> pd.Series:
    """Per row, the resolved ``accel.*`` knobs that differ from the row before it in its group.

    In an ablation this names what each step really added on this machine: a knob that resolved
    to the same value (``pin_memory`` on a CPU-only machine) does not appear.
    """
    knobs = [c for c in runs.columns if c.startswith("accel.")]
    out = pd.Series("", index=runs.index, dtype=object)
    for _, part in runs.groupby(GROUP, dropna=False, sort=False):
        previous = None
        for index, row in part.iterrows():
            if previous is not None:
                changed = [f"{k.removeprefix('accel.')}={_plain(row[k])}" for k in knobs
                           if _plain(row[k]) != _plain(previous[k])]
                out[index] = ", ".join(changed) if changed else "(nothing changed on this machine)"
            previous = row
    return out


# ---- time to target -------------------------------------------------------------------------------
def resolve_metric(tags: set[str], metric: str) -> str | None:
    """The logged tag a target names: as written, else under ``val/``, ``train/`` or ``perf/``."""
    for prefix in _PREFIXES:
        if prefix + metric in tags:
            return prefix + metric
    return None


def _series(scalars: pd.DataFrame, tag: str) -> pd.DataFrame:
    """One tag's points in step order, the last value logged at each step kept."""
    part = scalars[scalars["tag"] == tag].sort_values(["step", "wall_time"])
    return part.drop_duplicates("step", keep="last") if not part.empty else part


def time_to_target(scalars: pd.DataFrame, target: Target) -> dict[str, float | str]:
    """First step (and seconds since training began) where one run's series meets ``target``.

    ``state`` is ``reached``, ``not reached`` (logged, never met) or ``no series`` (the metric, or the
    reference metric of a relative target, never logged). A relative target is checked at the steps
    where both metrics were logged.
    """
    usable = scalars[scalars["phase"] != CEILING] if not scalars.empty else scalars
    tags = set(usable["tag"]) if not usable.empty else set()
    tag = resolve_metric(tags, target.metric)
    reference = resolve_metric(tags, target.reference) if target.reference else None
    if tag is None or (target.reference and reference is None):
        return {"state": "no series", "step": math.nan, "elapsed_s": math.nan}
    series = usable[usable["tag"] == tag].sort_values(["step", "wall_time"])
    if reference is not None:
        refs = _series(usable, reference).set_index("step")["value"]
        series = series[series["step"].isin(refs.index)]
        hits = series[[target.met(v, refs[s]) for v, s in zip(series["value"], series["step"])]]
    else:
        hits = series[[target.met(v) for v in series["value"]]]
    if hits.empty:
        return {"state": "not reached", "step": math.nan, "elapsed_s": math.nan}
    first = hits.iloc[0]
    return {"state": "reached", "step": float(first["step"]), "elapsed_s": float(first["elapsed_s"])}


def with_recorded_targets(targets: list[Target], runs: pd.DataFrame) -> list[Target]:
    """``targets`` followed by every target a run recorded (``bench.targets``) that is not among them."""
    out = list(targets)
    labels = {t.label for t in out}
    recorded = runs["targets"] if "targets" in runs else []
    for text in recorded:
        for word in str(text).split() if isinstance(text, str) else []:
            try:
                target = parse_target(word)
            except ValueError:  # written by another version: the run's own check let it through
                continue
            if target.label not in labels:
                labels.add(target.label)
                out.append(target)
    return out


def target_column(target: Target, field: str) -> str:
    """``to val/minFDE<=2.0 steps``: never starts with ``val/``, so never mistaken for a metric."""
    return f"to {target.label} {field}"


def add_targets(runs: pd.DataFrame, scalars: pd.DataFrame, targets: list[Target]) -> pd.DataFrame:
    """Per target, columns ``to <label> state``, ``... steps`` and ``... wall_s``."""
    out = runs.copy()
    for target in targets:
        results = []
        for run_dir in out["run_dir"]:
            own = scalars[scalars["run_dir"] == run_dir] if not scalars.empty else scalars
            results.append(time_to_target(own, target))
        out[target_column(target, "state")] = [r["state"] for r in results]
        out[target_column(target, "steps")] = [r["step"] for r in results]
        out[target_column(target, "wall_s")] = [r["elapsed_s"] for r in results]
    return out


def analyse(runs: pd.DataFrame, scalars: pd.DataFrame, targets: list[Target]) -> pd.DataFrame:
    """The report's table: ordered rows with speedup, repeat labels and time-to-target columns."""
    if runs.empty:
        return runs
    return add_targets(add_repeat_labels(add_speedup(order_runs(runs))), scalars, targets)
