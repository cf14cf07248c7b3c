"""The report's figures. Each function returns a matplotlib Figure (the notebooks show them inline);
:func:`save_plots` writes them as PNG files.

Layout: one panel per model (and size), settings along the x axis in sweep order, one bar colour per
machine, so that "what does this knob buy on this machine" reads left to right and machines read
side by side.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from drivebench.report.analysis import Target, setting_order, target_column
from drivebench.report.convergence import (Followed, convergence_rows, convergence_targets, is_stopped,
                                           threshold_curve, validation_curve)
from drivebench.report.events import TRAIN

LOSS_TAG = "train/loss"
DPI = 110


def _panels(runs: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One panel per model and size, split further by data and bench when the runs mix them (a
    setting may then repeat across panels, never inside one, where it labels one bar per machine)."""
    def text(column: str) -> pd.Series:  # a missing value reads "?" (NaN would match no panel)
        values = runs[column] if column in runs else pd.Series(None, index=runs.index, dtype=object)
        return values.map(lambda v: "?" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))

    keys = text("model") + " (" + text("model_size") + ")"
    for column in ("data", "bench"):
        if column in runs and runs[column].nunique(dropna=False) > 1:
            keys = keys + f", {column} " + text(column)
    return [(key, runs[keys == key]) for key in dict.fromkeys(keys)]


def _figure(n_panels: int, width: float, height: float = 4.2, max_cols: int = 2) -> tuple[Figure, list[plt.Axes]]:
    ncols = min(n_panels, max_cols)
    nrows = math.ceil(n_panels / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False,
                             layout="constrained")
    flat = list(axes.ravel())
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _run_label(row: pd.Series) -> str:
    return f"{row['setting_key']} | {row['machine']}"


def bar_chart(runs: pd.DataFrame, value: str, title: str, ylabel: str, scale: float = 1.0,
              low: str | None = None, high: str | None = None, reference: float | None = None,
              reference_label: str | None = None) -> Figure:
    """Grouped bars: x = setting, one bar per machine, optional p10-p90 error bars and a reference line."""
    panels = _panels(runs)
    machines = list(dict.fromkeys(runs["machine"]))
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(machines)}
    widest = max(len(p[1]["setting_key"].unique()) for p in panels)
    fig, axes = _figure(len(panels), width=max(6.0, 1.1 * widest * max(len(machines), 1) ** 0.5 + 2))
    for ax, (name, part) in zip(axes, panels):
        settings = [s for s in _key_order(part)]
        x = np.arange(len(settings))
        width = min(0.8 / max(len(machines), 1), 0.45)
        for i, machine in enumerate(machines):
            rows = part[part["machine"] == machine].set_index("setting_key").reindex(settings)
            if rows[value].isna().all():
                continue
            heights = rows[value].to_numpy(dtype=float) * scale
            err = None
            if low is not None and high is not None:
                lo = (rows[value] - rows[low]).to_numpy(dtype=float) * scale
                hi = (rows[high] - rows[value]).to_numpy(dtype=float) * scale
                err = np.vstack([np.nan_to_num(np.clip(lo, 0, None)), np.nan_to_num(np.clip(hi, 0, None))])
            pos = x + width * (i - (len(machines) - 1) / 2)
            ax.bar(pos, np.nan_to_num(heights), width, yerr=err, capsize=4, color=colours[machine],
                   label=machine, edgecolor="black", linewidth=0.5, error_kw={"elinewidth": 1, "ecolor": "0.25"})
            tops = heights + (err[1] if err is not None else 0)
            for px, h, top in zip(pos, heights, tops):
                if not math.isnan(h):  # the value sits above the whisker, never on it
                    ax.annotate(f"{h:.3g}", (px, top), xytext=(0, 3), textcoords="offset points", ha="center",
                                va="bottom", fontsize=8)
        if reference is not None:
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1, label=reference_label)
        ax.set_xticks(x, settings, rotation=25, ha="right")
        ax.set_xlim(-0.75, len(settings) - 0.25)  # a lone bar stays a bar, not a wall
        ax.set_xlabel("accel setting (sweep order)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {name}")
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    _figure_legend(fig, axes, title="machine")
    return fig


def _figure_legend(fig: Figure, axes: list[plt.Axes], title: str) -> None:
    """One legend for all panels, under them (panels share machines; a legend inside hides bars)."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries.keys()), title=title, loc="outside lower center",
                   ncol=min(len(entries), 3), fontsize=8, title_fontsize=8)


def _key_order(part: pd.DataFrame) -> list[str]:
    order = setting_order(part)
    keys = list(dict.fromkeys(part["setting_key"]))
    return sorted(keys, key=lambda k: (order.index(k.split(" #")[0]) if k.split(" #")[0] in order else 99, k))


def throughput_figure(runs: pd.DataFrame) -> Figure:
    return bar_chart(runs, "throughput_median", "Training throughput",
                     "samples/s per process\n(median step; whiskers p10-p90)", low="throughput_p10",
                     high="throughput_p90")


def data_wait_figure(runs: pd.DataFrame) -> Figure:
    return bar_chart(runs, "data_wait_fraction", "Time waiting for data", "data wait (% of step time)",
                     scale=100.0)


def efficiency_figure(runs: pd.DataFrame) -> Figure:
    return bar_chart(runs, "efficiency", "Efficiency against the ceiling",
                     "train / ceiling throughput (%)", scale=100.0, reference=100.0,
                     reference_label="ceiling (batch resident on the device)")


BREAKDOWN = (("data_wait_s_mean", "waiting for data", "tab:red"),
             ("h2d_s_mean", "host-to-device copy", "tab:orange"),
             ("gpu_preprocess_s_mean", "device preprocessing", "tab:purple"),
             ("compute_s_mean", "forward + backward + optimizer", "tab:blue"),
             ("loop_overhead_s_mean", "between steps (hooks, logging, host sync)", "tab:olive"),
             ("_other_s", "other (hooks, logging)", "tab:gray"))


def step_breakdown_figure(runs: pd.DataFrame) -> Figure:
    """Where a step's time goes: stacked means per run (setting | machine), one panel per model."""
    panels = _panels(runs)
    tallest = max(len(p) for _, p in panels)
    fig, axes = _figure(len(panels), width=8.0, height=max(3.0, 0.5 * tallest + 1.6))
    for ax, (name, part) in zip(axes, panels):
        part = part.assign(_other_s=(part["step_s_mean"] - part[[k for k, _, _ in BREAKDOWN[:-1]]]
                                     .fillna(0).sum(axis=1)).clip(lower=0))
        y = np.arange(len(part))
        left = np.zeros(len(part))
        for key, label, colour in BREAKDOWN:
            widths = part[key].fillna(0).to_numpy(dtype=float) * 1e3
            if not widths.any():
                continue
            ax.barh(y, widths, left=left, color=colour, label=label, edgecolor="black", linewidth=0.4)
            left += widths
        for yi, total in zip(y, left):
            ax.annotate(f"{total:.0f} ms" if total >= 100 else f"{total:.3g} ms", (total, yi), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=8)
        ax.set_yticks(y, [_run_label(r) for _, r in part.iterrows()], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(left.max(), 1e-9) * 1.25)
        ax.set_xlabel("mean time per training step (ms)")
        ax.set_title(f"Where a training step's time goes: {name}")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def series_figure(runs: pd.DataFrame, scalars: pd.DataFrame, tag: str, ylabel: str,
                  x: str = "step") -> Figure | None:
    """Any logged scalar (``perf/step_time_s``, ``perf/data_wait_frac``, ...) per run against step or time."""
    if scalars.empty or not (scalars["tag"] == tag).any():
        return None
    curves = scalars[scalars["tag"] == tag]
    panels = [(n, p) for n, p in _panels(runs) if p["run_dir"].isin(curves["run_dir"]).any()]
    fig, axes = _figure(len(panels), width=7.0)
    for ax, (name, part) in zip(axes, panels):
        for _, row in part.iterrows():
            curve = curves[curves["run_dir"] == row["run_dir"]].sort_values(["step", "wall_time"])
            if not curve.empty:
                ax.plot(curve[x], curve["value"], marker="o", markersize=3, linewidth=1.2, label=_run_label(row))
        ax.set_xlabel("optimizer step" if x == "step" else "wall time since training began (s)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{tag}: {name}")
        ax.grid(alpha=0.3)
        ax.legend(title="setting | machine", fontsize=7, title_fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def loss_figure(runs: pd.DataFrame, scalars: pd.DataFrame, x: str = "step") -> Figure | None:
    """Training loss per run against ``step`` or ``elapsed_s``; None when no run logged a loss curve."""
    if scalars.empty:
        return None
    curves = scalars[(scalars["tag"] == LOSS_TAG) & (scalars["phase"] == TRAIN)]
    if curves.empty:
        return None
    panels = [(n, p) for n, p in _panels(runs) if p["run_dir"].isin(curves["run_dir"]).any()]
    fig, axes = _figure(len(panels), width=7.0)
    for ax, (name, part) in zip(axes, panels):
        for _, row in part.iterrows():
            curve = curves[curves["run_dir"] == row["run_dir"]].sort_values(["step", "wall_time"])
            if curve.empty:
                continue
            ax.plot(curve[x], curve["value"], marker="o", markersize=3, linewidth=1.3, label=_run_label(row))
        ax.set_xlabel("optimizer step" if x == "step" else "wall time since training began (s)")
        ax.set_ylabel("training loss (train/loss)")
        ax.set_title(f"Training loss vs {'step' if x == 'step' else 'wall time'}: {name}")
        ax.grid(alpha=0.3)
        ax.legend(title="setting | machine", fontsize=7, title_fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def time_to_target_figure(runs: pd.DataFrame, targets: list[Target]) -> Figure | None:
    """Horizontal bars: seconds to each target per run, annotated with the step; unmet ones say so."""
    if not targets or runs.empty:
        return None
    # a run that never logged the metric (another model's metric) has no place on its panel
    shown = [(t, runs[runs[target_column(t, "state")] != "no series"]) for t in targets]
    shown = [(t, part) for t, part in shown if not part.empty]
    if not shown:
        return None
    tallest = max(len(part) for _, part in shown)
    fig, axes = _figure(len(shown), width=9.0, height=max(2.2, 0.42 * tallest + 1.4), max_cols=1)
    for ax, (target, part) in zip(axes, shown):
        labels = [f"{r['model']} ({r['model_size']}) | {_run_label(r)}" for _, r in part.iterrows()]
        secs = part[target_column(target, "wall_s")].to_numpy(dtype=float)
        steps = part[target_column(target, "steps")].to_numpy(dtype=float)
        states = part[target_column(target, "state")].tolist()
        y = np.arange(len(part))
        ax.barh(y, np.nan_to_num(secs), color="tab:green", edgecolor="black", linewidth=0.5)
        top = np.nanmax(secs) if np.isfinite(secs).any() else 1.0
        for yi, s, st, state in zip(y, secs, steps, states):
            text = f"{s:.3g} s, step {st:.0f}" if state == "reached" else state
            ax.annotate(text, (0 if math.isnan(s) else s, yi), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=8)
        ax.set_xlim(0, top * 1.35)
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("wall time since training began (s)")
        ax.set_title(f"Time to target {target.label} (first logged value that meets it)")
        ax.grid(axis="x", alpha=0.3)
    return fig


def _seed_text(row: pd.Series) -> str:
    seed = row.get("seed")
    return f" seed {seed:.0f}" if isinstance(seed, float) and not math.isnan(seed) else ""


def convergence_figure(runs: pd.DataFrame, scalars: pd.DataFrame, targets: list[Target],
                       x: str = "step") -> Figure | None:
    """Each target's validation metric per run against ``step`` or ``elapsed_s``: every setting and seed
    of a model on one panel (one colour per setting, one line style per seed), the target dashed, and
    the point where each run first met it marked."""
    panels = []
    for target in convergence_targets(runs, scalars, targets):
        rows = convergence_rows(runs, scalars, target)
        panels += [(target, name, part) for name, part in _panels(rows)]
    if not panels:
        return None
    fig, axes = _figure(len(panels), width=7.5, max_cols=2)
    styles = ["-", "--", ":", "-."]
    for ax, (target, name, part) in zip(axes, panels):
        settings = list(dict.fromkeys(part["setting"]))
        colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(settings)}
        nth: dict[str, int] = {}
        for _, row in part.iterrows():
            curve = validation_curve(scalars, row["run_dir"], target.metric)
            k = nth[row["setting"]] = nth.get(row["setting"], -1) + 1
            cut = is_stopped(row)
            label = f"{row['setting']}{_seed_text(row)} | {row['machine']}" + (" (stopped early: x)" if cut else "")
            ax.plot(curve[x], curve["value"], marker="o", markersize=3, linewidth=1.4, color=colours[row["setting"]],
                    linestyle=styles[k % len(styles)], label=label)
            if cut:  # where its validations end: a stop, not the end of its schedule
                ax.plot(curve[x].iloc[-1:], curve["value"].iloc[-1:], marker="x", markersize=9,
                        color=colours[row["setting"]], linestyle="none")
            if row.get(target_column(target, "state")) == "reached":
                at = row[target_column(target, "steps" if x == "step" else "wall_s")]
                hit = curve.iloc[(curve[x] - at).abs().argsort()[:1]]
                ax.plot(hit[x], hit["value"], marker="*", markersize=12, color=colours[row["setting"]],
                        markeredgecolor="black", linestyle="none")
        threshold = threshold_curve(scalars, part["run_dir"].iloc[0], target)
        if threshold is not None:
            ax.plot(threshold[x], threshold["value"], color="grey", linestyle="--", linewidth=1,
                    label=f"target {target.op} {target.value_text or target.value} x {target.reference}")
        else:
            ax.axhline(target.value, color="grey", linestyle="--", linewidth=1, label=f"target {target.label}")
        ax.set_xlabel("optimizer step" if x == "step" else "wall time since training began (s)")
        ax.set_ylabel(target.metric)
        ax.set_xlim(left=0)
        ax.set_title(f"{target.metric} vs {'step' if x == 'step' else 'wall time'}: {name}", fontsize=10)
        ax.grid(alpha=0.3)
        # the marker key in the legend's title: a second title line wider than the axes would be cut off
        ax.legend(title="setting seed | machine\n(* = first validation meeting the target)", fontsize=7,
                  title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


# why a figure has nothing to draw (save_plots reports it with the figure's name)
NOTHING_TO_DRAW = {
    "throughput": "no run measured a throughput (training, ceiling or loader)",
    "data_wait": "no run measured training steps (bench=ceiling, loader and storage do not)",
    "efficiency": "no run measured both training and the ceiling (bench.ceiling=false, or bench=ceiling, loader "
                  "or storage)",
    "step_breakdown": "no run measured training steps (bench=ceiling, loader and storage do not)",
    "loss_vs_step": "no run has a readable train/loss series in its TensorBoard events",
    "loss_vs_time": "no run has a readable train/loss series in its TensorBoard events",
    "time_to_target": "no run logged the targets' metrics",
    "convergence_vs_step": "no run logged a target's validation metric at two steps or more (validation "
                           "during training: +experiment=convergence)",
    "convergence_vs_time": "no run logged a target's validation metric at two steps or more (validation "
                           "during training: +experiment=convergence)",
}


def figures(runs: pd.DataFrame, scalars: pd.DataFrame, targets: list[Target],
            followed: Followed | None = None) -> dict[str, Callable[[], Figure | None]]:
    """Name -> a function drawing it (drawn lazily, one at a time, so memory stays flat). ``followed``: the
    runs the convergence figures draw and their scalars (``convergence.followed_runs``: the completed ones,
    those stopped early, resumed ones joined); by default ``runs`` and ``scalars``."""
    followed = Followed(runs, scalars) if followed is None else followed
    out: dict[str, Callable[[], Figure | None]] = {}
    if not runs.empty:
        out = {
            "throughput": lambda: throughput_figure(runs) if runs["throughput_median"].notna().any() else None,
            "data_wait": lambda: data_wait_figure(runs) if runs["data_wait_fraction"].notna().any() else None,
            "efficiency": lambda: efficiency_figure(runs) if runs["efficiency"].notna().any() else None,
            "step_breakdown": lambda: step_breakdown_figure(runs) if runs["step_s_mean"].notna().any() else None,
            "loss_vs_step": lambda: loss_figure(runs, scalars, "step"),
            "loss_vs_time": lambda: loss_figure(runs, scalars, "elapsed_s"),
        }
        if targets:
            out["time_to_target"] = lambda: time_to_target_figure(runs, targets)
    if targets and not followed.runs.empty:
        out["convergence_vs_step"] = lambda: convergence_figure(followed.runs, followed.scalars, targets, "step")
        out["convergence_vs_time"] = lambda: convergence_figure(followed.runs, followed.scalars, targets, "elapsed_s")
    return out


def save_plots(runs: pd.DataFrame, scalars: pd.DataFrame, targets: list[Target], out: Path,
               skipped: dict[str, str] | None = None, followed: Followed | None = None) -> dict[str, Path]:
    """Write every figure that has data as ``<out>/<name>.png``; returns name -> path. A figure left
    out goes into ``skipped`` (name -> why): nothing to draw, or a drawing error, which costs that
    figure only (a set of runs this report has not met must not cost the rest of the report).
    ``followed``: as for :func:`figures`."""
    written: dict[str, Path] = {}
    skipped = {} if skipped is None else skipped
    for name, draw in figures(runs, scalars, targets, followed).items():
        try:
            fig = draw()
            if fig is None:
                skipped[name] = NOTHING_TO_DRAW.get(name, "nothing to draw")
                continue
            path = out / f"{name}.png"
            fig.savefig(path, dpi=DPI)
        except (ValueError, TypeError, KeyError, IndexError) as err:  # what odd data raises in pandas/matplotlib
            skipped[name] = f"could not be drawn from these runs ({type(err).__name__}: {err})"
            plt.close("all")
            continue
        plt.close(fig)
        written[name] = path
    return written
