"""Convergence runs: a validation metric followed epoch by epoch, compared across settings and seeds.

A run counts here for a target when the target's metric is a validation series it logged at two
steps or more (validation during training, e.g. ``+experiment=convergence``), or at one step for a run
stopped before its schedule ended. Per setting, over its
seeds: the final metric (mean, min-max, spread), the time and steps to the target (median over
seeds), the time-to-target ratio against ``none``, and whether the final metric is "the same" as
``none``'s by the rule below.

The same convergence, in numbers: a setting's mean final metric differs from ``none``'s by no more
than the larger seed-to-seed spread (max - min over seeds) of the two settings. With one seed
there is no spread to compare against, and the verdict says so instead of guessing. The rule is
judged per machine, and again over every machine in the report (``*_every_machine`` columns): what a
run learns depends on its arithmetic, not on the machine's speed, so the finals of one setting pool over
machines where its runs changed the same numerics (``settings.numerics_changed_by``; a CPU's ``max``, in
fp32 without compile, does not pool with a GPU's), and a machine with one ``none`` seed is judged against
the seeds of all of them.

The finals rule judges where training ended; how the metric went on the way there is compared at equal
steps: per validation step that runs of both settings logged, the setting's mean over its runs minus
``none``'s (signed so that a positive gap is worse for the target's direction), averaged over those steps
(``behind_none_at_equal_steps``), next to ``none``'s own seed spread at those steps. Finals inside the seed
spread can still hide a lag at every validation (QCNet on a GPU: ``max`` trails ``none`` by ~0.2 m of minFDE
at each epoch), and such a lag, not speed, is what moves a time to target by a whole validation.

A run stopped by a signal before its schedule ended (a time cap on a convergence job) counts with
the validations it logged before the stop: when it met the target is a fact of its curve, so its
time to target counts; it has no final metric (its schedule did not end), so the final-metric
columns and the seed spread are over the runs that completed. A run stopped (or killed) after its
schedule's last step, its last validation logged there (a cap that came in the end-of-run validation),
has finished its schedule: that validation is its final, as a completed run's is (summary
``run.schedule_steps``; runs written before 2026-12-06 lack it and keep no final).

A run that did not meet the target (stopped before it, or its schedule ended first) bounds its time to
target from below: it would have met it, if ever, after its last logged training value. Such runs stand
in with their training spans (each true time is longer, so a median is at least the median of these):
where only ``none`` has them, a setting's ratio is a floor (a short-capped ``none`` run still answers
"at least Nx sooner"); where only the setting has them, a ceiling ("at most Nx").

How long a schedule the aim needs: a setting that starts late (a compile, graph captures) but trains faster
reaches a target sooner by a ratio that grows with the validation at which the target falls, toward the ratio
of the validation intervals. From the paces (first validation ``F``, then every ``B``, medians) and with both
settings crossing at the same validation ``k``, the ratio there is ``(F_none + (k-1) B_none) / (F + (k-1) B)``;
``validations_for_aim`` is the first ``k`` from which it stays at or above ``SOONER_AIM`` (the project's 3x), NaN
where the pace ratio is below the aim (a longer schedule moves the ratio toward the pace ratio, below the aim).
A target that ``none`` meets at an earlier validation measures the start more than the training (QCNet on one
H100, b52: 3x from validation 35 on; its target falls at the third).

A run continued from its checkpoint (``resume``: the same ``run_id``) is one run here, not two: its
segments' validations form one curve, and its clock is the sum of the segments' training time (each
from its first step to its last logged value), so the time to target counts what every segment spent,
restarts and redone steps included, and never the time between them.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

import pandas as pd

from drivebench.perf.targets import Target
from drivebench.report.analysis import BASELINE_SETTING, GROUP, add_targets, order_runs, resolve_metric, target_column
from drivebench.report.events import TRAIN, VALIDATION

MIN_POINTS = 2  # validation at two steps at least: a curve, not the end-of-run figure alone
SOONER_AIM = 3.0  # how many times sooner than none a setting should reach a target (the project's number)


def _run_tags(scalars: pd.DataFrame, run_dir: str) -> set[str]:
    own = scalars[scalars["run_dir"] == run_dir]
    return set(own["tag"])


def validation_curve(scalars: pd.DataFrame, run_dir: str, metric: str) -> pd.DataFrame:
    """One run's validation series of ``metric`` (step, elapsed_s, value), in step order.

    Validation during training lives in the training phase's events; the end-of-run validation
    repeats the last epoch's weights, so it is used only when the run did not validate while training.
    """
    if scalars.empty:
        return pd.DataFrame(columns=["step", "elapsed_s", "value"])
    own = scalars[scalars["run_dir"] == run_dir]
    tag = resolve_metric(set(own["tag"]), metric)
    if tag is None:
        return pd.DataFrame(columns=["step", "elapsed_s", "value"])
    series = own[own["tag"] == tag]
    during = series[series["phase"] == TRAIN]
    chosen = during if not during.empty else series[series["phase"] == VALIDATION]
    chosen = chosen.sort_values(["step", "wall_time"]).drop_duplicates("step", keep="last")
    return chosen[["step", "elapsed_s", "value"]].reset_index(drop=True)


@dataclass
class Followed:
    """The runs the convergence tables and plots follow, and the scalars to follow them by (a resumed run's
    segments on one clock)."""

    runs: pd.DataFrame
    scalars: pd.DataFrame


def followed_runs(runs: pd.DataFrame, stopped: pd.DataFrame, scalars: pd.DataFrame,
                  targets: list[Target]) -> Followed:
    """The runs the convergence tables follow, and the scalars to follow them by: the analysed completed
    ``runs`` and the ``stopped`` ones (``loading.RunSet.stopped``; column ``stopped``), the segments of a
    resumed run joined into one (:func:`join_resumed`; column ``segments``), each with its time to every
    target, in the report's order."""
    frames = [f for f in (runs.assign(stopped=False), stopped.assign(stopped=True)) if not f.empty]
    if not frames:
        return Followed(runs.assign(stopped=False, segments=1), scalars)
    rows, joined = join_resumed(pd.concat(frames, ignore_index=True), scalars)
    # times to target: the completed runs have theirs from analyse; the stopped ones have none yet, and a
    # joined run's were taken on its last process's own clock
    fresh = rows["stopped"].astype(bool) | (rows["segments"] > 1)
    if fresh.any():
        stale = [c for c in rows.columns if c.startswith("to ")]
        redone = add_targets(rows[fresh].drop(columns=stale), joined, targets)
        rows = pd.concat([rows[~fresh], redone])
    return Followed(order_runs(rows), joined)


def _training_span(own: pd.DataFrame) -> float:
    """Seconds from a segment's first training step to its last value logged in training (0 without any)."""
    train = own[own["phase"] == TRAIN]["elapsed_s"] if not own.empty else own
    return float(train.max()) if len(train) and pd.notna(train.max()) else 0.0


def join_resumed(rows: pd.DataFrame, scalars: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per training: the segments of a run continued from its checkpoint (one ``run_id``, in start
    order) become their last segment's row (``segments``: how many; stopped if the last one was), and
    their scalars that row's, each segment's clock shifted by the training time of those before it."""
    rows = rows.assign(segments=1)
    if "run_id" not in rows or rows["run_id"].isna().all():
        return rows, scalars
    keep, moved, frames = [], set(), []
    for run_id, part in rows.groupby("run_id", dropna=False, sort=False):
        if pd.isna(run_id) or len(part) < 2:
            keep += list(part.index)
            continue
        part = part.sort_values("started", kind="stable")
        last = part.index[-1]
        offset = 0.0
        for _, segment in part.iterrows():
            own = scalars[scalars["run_dir"] == segment["run_dir"]]
            frames.append(own.assign(run_dir=rows.loc[last, "run_dir"], elapsed_s=own["elapsed_s"] + offset))
            offset += _training_span(own)
            moved.add(segment["run_dir"])
        rows.loc[last, "segments"] = len(part)
        if "compile_s" in part:  # each process compiled (a warm cache makes the later ones short)
            rows.loc[last, "compile_s"] = part["compile_s"].sum(min_count=1)
        keep.append(last)
    if not moved:
        return rows, scalars
    rest = scalars[~scalars["run_dir"].isin(moved)]
    return rows.loc[sorted(keep)], pd.concat([rest, *frames], ignore_index=True)


def is_stopped(row: pd.Series) -> bool:
    """Whether a row of :func:`followed_runs` was stopped before its schedule ended."""
    return bool(row.get("stopped", False) == True)  # noqa: E712 (NaN and numpy booleans alike)


def validated_at_schedule_end(row: pd.Series, curve: pd.DataFrame) -> bool:
    """Whether a stopped run's last validation came at its schedule's last step (Lightning logs an epoch's
    validation at the step before the count reaches it), so that it is the run's final metric."""
    scheduled = row.get("schedule_steps")
    return bool(scheduled == scheduled and scheduled and len(curve) and curve["step"].iloc[-1] >= scheduled - 1)


def convergence_targets(runs: pd.DataFrame, scalars: pd.DataFrame, targets: list[Target]) -> list[Target]:
    """The targets on a validation metric that some run followed over training (>= 2 points)."""
    out = []
    for target in targets:
        if scalars.empty or runs.empty:
            break
        for run_dir in runs["run_dir"]:
            tag = resolve_metric(_run_tags(scalars, run_dir), target.metric)
            if tag is not None and tag.startswith("val/") and len(validation_curve(scalars, run_dir, tag)) >= MIN_POINTS:
                out.append(target)
                break
    return out


def unfollowed_targets(runs: pd.DataFrame, scalars: pd.DataFrame, targets: list[Target]) -> list[str]:
    """One line per target that no run logged (the metric or its reference) although some run validated
    during training: a misspelt target would otherwise leave the convergence section without a word."""
    curves = {}
    for run_dir in runs["run_dir"] if not runs.empty and not scalars.empty else []:
        own = scalars[(scalars["run_dir"] == run_dir) & (scalars["phase"] == TRAIN)]
        val = own[own["tag"].str.startswith("val/")]
        if val["step"].nunique() >= MIN_POINTS:
            curves[run_dir] = set(val["tag"])
    if not curves:
        return []
    logged = set().union(*curves.values())
    lines = []
    for target in targets:
        for metric in (m for m in (target.metric, target.reference) if m and resolve_metric(logged, m) is None):
            close = difflib.get_close_matches(metric if metric.startswith("val/") else f"val/{metric}", logged, n=3)
            hint = (f"did you mean {' or '.join(close)}?" if close
                    else f"they logged {', '.join(sorted(t for t in logged if '@' not in t)[:8])}, ...")
            lines.append(f"{target.label}: no run that validated during training logged {metric}, so it has no "
                         f"convergence table; {hint}")
    return lines


def convergence_rows(runs: pd.DataFrame, scalars: pd.DataFrame, target: Target) -> pd.DataFrame:
    """The runs that followed ``target``'s metric over training (a run stopped early: from its first validation
    on, so one cut after it still counts with its floor), with its final value (``final``; NaN for a
    run stopped before its schedule's last step: its last validation is not a final) and its training span
    (``training_s``: the floor of its time to target where it did not meet it), and its pace: the seconds to its
    first validation (``first_validation_s``: one-time costs such as compiling are in it) and the median seconds
    between its later validations (``between_validations_s``: an epoch and its validation where it validates
    every epoch), so a short schedule's ratio can be read against what a longer one approaches; and its
    validation values by step (``curve``), for the comparison at equal steps."""
    keep, finals, firsts, spans, first_s, between_s, curves = [], [], [], [], [], [], []
    for index, row in runs.iterrows():
        own = scalars[scalars["run_dir"] == row["run_dir"]] if not scalars.empty else scalars
        curve = validation_curve(own, row["run_dir"], target.metric)
        if len(curve) < (1 if is_stopped(row) else MIN_POINTS):  # a stopped run's one validation was in training
            continue
        keep.append(index)
        final = not is_stopped(row) or validated_at_schedule_end(row, curve)
        finals.append(float(curve["value"].iloc[-1]) if final else math.nan)
        firsts.append(float(curve["step"].iloc[0]))
        spans.append(_training_span(own))
        first_s.append(float(curve["elapsed_s"].iloc[0]))
        gaps = curve["elapsed_s"].diff().dropna()
        between_s.append(float(gaps.median()) if len(gaps) else math.nan)
        curves.append(dict(zip(curve["step"].astype(int), curve["value"].astype(float))))
    return runs.loc[keep].assign(final=finals, first_validation_step=firsts, training_s=spans,
                                 first_validation_s=first_s, between_validations_s=between_s, curve=curves)


def met_at_first_validation(row: pd.Series, target: Target) -> bool:
    """Whether a row of :func:`convergence_rows` met ``target`` the first time it validated: its time to
    target is then the time to its first validation, whatever the model learnt."""
    return (row[target_column(target, "state")] == "reached"
            and row[target_column(target, "steps")] == row["first_validation_step"])


def _mean(values: pd.Series) -> float:
    return float(values.mean()) if len(values) else math.nan


def _spread(values: pd.Series) -> float:
    return float(values.max() - values.min()) if len(values) >= 2 else math.nan


def same_convergence(mean: float, spread: float, base_mean: float, base_spread: float, n: int, base_n: int) -> str:
    """``yes`` / ``no`` by the module's rule, or why it cannot be judged."""
    if any(math.isnan(v) for v in (mean, base_mean)):
        return "no final metric"
    if n < 2 or base_n < 2:
        return "one seed: no spread to judge by"
    allowed = max(spread, base_spread)
    return "yes" if abs(mean - base_mean) <= allowed else "no"


def gap_at_equal_steps(curves: pd.Series, base_curves: pd.Series, target: Target) -> tuple[float, float, int]:
    """(how far these runs' metric is behind the ``base_curves`` runs' at the validation steps both logged,
    ``none``'s seed spread there, how many such steps): at each step the mean over the runs that logged it on
    each side, their difference signed so that a positive gap is worse for ``target`` (higher for ``<=``), then
    the mean over the steps; the spread is the mean of the base runs' max - min at the steps where two or more
    logged it (NaN with one base run)."""
    this, base = pd.DataFrame(list(curves)), pd.DataFrame(list(base_curves))
    steps = sorted(set(this.columns) & set(base.columns))
    this_mean, base_mean = this[steps].mean(), base[steps].mean()
    steps = [s for s in steps if math.isfinite(this_mean[s]) and math.isfinite(base_mean[s])]
    if not steps:
        return math.nan, math.nan, 0
    worse_when_higher = target.op in ("<=", "<")
    gap = (this_mean[steps] - base_mean[steps]).mean() * (1.0 if worse_when_higher else -1.0)
    several = [s for s in steps if base[s].count() >= 2]
    spread = float((base[several].max() - base[several].min()).mean()) if several else math.nan
    return float(gap), spread, len(steps)


def _column_median(part: pd.DataFrame, column: str) -> float:
    """The median of a per-run column the runs may not carry (older summaries, tests' tables): NaN then."""
    return float(part[column].median()) if column in part else math.nan


def convergence_table(runs: pd.DataFrame, scalars: pd.DataFrame, target: Target) -> pd.DataFrame:
    """One row per (machine, model, size, data, setting): final metric over seeds and time to target."""
    rows = convergence_rows(runs, scalars, target)
    columns = ["machine", "model", "model_size", "setting", "runs", "seeds", "finals", "final_mean", "final_min",
               "final_max", "final_spread", "reached", "runs_reached", "stopped_before_target",
               "reached_at_first_validation", "resumed",
               "to_target_wall_s_median", "to_target_steps_median", "to_target_wall_s_median_all", "compile_s_median",
               "compile_cache",
               "not_reached_by_s", "wall_s_vs_none", "wall_s_vs_none_min", "wall_s_vs_none_max", "wall_s_vs_none_bound",
               "first_validation_s_median", "between_validations_s_median", "between_validations_vs_none",
               "validation_first_s_median", "validation_s_median",
               "validations_for_aim", "same_as_none", "none_finals", "none_runs", "behind_none_at_equal_steps",
               "none_spread_at_equal_steps", "equal_steps"]
    if rows.empty:
        return pd.DataFrame(columns=columns + EVERY_MACHINE)
    state, wall, steps = (target_column(target, f) for f in ("state", "wall_s", "steps"))
    out = []
    for keys, part in rows.groupby([*GROUP, "setting"], dropna=False, sort=False):
        reached = part[part[state] == "reached"]
        finals = part["final"].dropna()
        # each run's time to target, or its floor where it did not meet it
        floors = part[wall].where(part[state] == "reached", part["training_s"])
        unreached_s = part.loc[part[state] != "reached", "training_s"]  # what the runs that never met it trained
        out.append({
            **dict(zip([*GROUP, "setting"], keys)),
            "runs": len(part),
            "seeds": ",".join(str(int(s)) for s in sorted(part["seed"].dropna().unique())),
            "finals": len(finals),  # runs that completed their schedule
            "final_mean": _mean(finals),
            "final_min": float(finals.min()) if len(finals) else math.nan,
            "final_max": float(finals.max()) if len(finals) else math.nan,
            "final_spread": _spread(finals),
            "reached": f"{len(reached)}/{len(part)}",  # for reading; runs_reached for counting
            "runs_reached": len(reached),
            # stopped by a signal without having met it: when (or whether) they would have is unknown
            "stopped_before_target": int(sum(is_stopped(r) and r[state] != "reached" for _, r in part.iterrows())),
            "reached_at_first_validation": int(sum(met_at_first_validation(r, target) for _, r in part.iterrows())),
            # continued from a checkpoint: one run over several processes, its time summed over them
            "resumed": int((part["segments"] > 1).sum()) if "segments" in part else 0,
            "to_target_wall_s_median": float(reached[wall].median()) if len(reached) else math.nan,
            "to_target_steps_median": float(reached[steps].median()) if len(reached) else math.nan,
            "to_target_wall_s_min": float(reached[wall].min()) if len(reached) else math.nan,
            "to_target_wall_s_max": float(reached[wall].max()) if len(reached) else math.nan,
            "to_target_wall_s_floor_median": float(floors.median()),
            "to_target_wall_s_median_all": median_if_known(reached[wall], unreached_s),
            "to_target_wall_s_floor_min": float(floors.min()),
            # the longest a run that did not meet it trained for: "not met in the first N s"
            "not_reached_by_s": float(unreached_s.max()) if len(unreached_s) else math.nan,
            # the one-time cost inside those seconds (a cold compile decides a short schedule)
            "compile_s_median": _column_median(part, "compile_s"),
            "compile_cache": (" / ".join(sorted(set(part["compile_cache"].dropna()))) or None) if "compile_cache" in part else None,
            # the pace: to the first validation (the one-time start in it), then between validations
            "first_validation_s_median": float(part["first_validation_s"].median()),
            "between_validations_s_median": float(part["between_validations_s"].median()),
            # how much of that pace is validating: the first validation, then each later one (summaries since
            # 2026-12-07; NaN for older runs)
            "validation_first_s_median": _column_median(part, "validation_first_s"),
            "validation_s_median": _column_median(part, "validation_s_median"),
            "curves": list(part["curve"]),  # for the gap at equal steps against this group's none runs
        })
    table = pd.DataFrame(out)
    for _, part in table.groupby(GROUP, dropna=False, sort=False):
        base = part[part["setting"] == BASELINE_SETTING]
        for index, row in part.iterrows():
            if base.empty:
                table.loc[index, "wall_s_vs_none"] = math.nan
                table.loc[index, "same_as_none"] = "no none run"
                continue
            b = base.iloc[0]
            table.loc[index, "none_finals"] = b["finals"]
            table.loc[index, "none_runs"] = b["runs"]
            # what a schedule long enough to bury the one-time start approaches (the same validation interval)
            table.loc[index, "between_validations_vs_none"] = _ratio(b["between_validations_s_median"],
                                                                     row["between_validations_s_median"])
            table.loc[index, "validations_for_aim"] = validations_for_aim(
                b["first_validation_s_median"], b["between_validations_s_median"],
                row["first_validation_s_median"], row["between_validations_s_median"])
            ratios = ratio_vs_none(b, row)
            for key, value in zip(("wall_s_vs_none", "wall_s_vs_none_min", "wall_s_vs_none_max", "wall_s_vs_none_bound"),
                                  ratios):
                table.loc[index, key] = value
            table.loc[index, "same_as_none"] = same_convergence(row["final_mean"], row["final_spread"], b["final_mean"],
                                                                b["final_spread"], row["finals"], b["finals"])
            if row["setting"] != BASELINE_SETTING:
                gap = gap_at_equal_steps(pd.Series(row["curves"]), pd.Series(b["curves"]), target)
                for key, value in zip(("behind_none_at_equal_steps", "none_spread_at_equal_steps", "equal_steps"), gap):
                    table.loc[index, key] = value
    _judge_over_every_machine(table, rows, target)
    return table.reindex(columns=columns + EVERY_MACHINE)


EVERY_MACHINE = ["finals_every_machine", "final_mean_every_machine", "final_spread_every_machine",
                 "none_finals_every_machine", "same_as_none_every_machine", "behind_none_at_equal_steps_every_machine",
                 "none_spread_at_equal_steps_every_machine", "runs_every_machine", "none_runs_every_machine"]


def _same_work(rows: pd.DataFrame, row: pd.Series, setting: str) -> pd.Series:
    """Which of every machine's runs are ``row``'s model, size and data at ``setting``; for a setting that
    changes numerics, only those whose changes are those of ``row``'s own runs (``none`` changes none)."""
    same_work = ((rows["model"] == row["model"]) & (rows["model_size"] == row["model_size"])
                 & (rows["data"] == row["data"]) & (rows["setting"] == setting))
    if "numerics_changed_by" in rows and setting != BASELINE_SETTING:
        own = rows.loc[same_work & (rows["machine"] == row["machine"]), "numerics_changed_by"].fillna("")
        same_work &= rows["numerics_changed_by"].fillna("").isin(set(own))
    return same_work


def _judge_over_every_machine(table: pd.DataFrame, rows: pd.DataFrame, target: Target) -> None:
    """The same-convergence rule and the gap at equal steps once more with every machine's runs (module
    docstring), in place."""
    for index, row in table.iterrows():
        this, none = _same_work(rows, row, row["setting"]), _same_work(rows, row, BASELINE_SETTING)
        finals, base = rows.loc[this, "final"].dropna(), rows.loc[none, "final"].dropna()
        table.loc[index, "finals_every_machine"] = len(finals)
        table.loc[index, "final_mean_every_machine"] = _mean(finals)
        table.loc[index, "final_spread_every_machine"] = _spread(finals)
        table.loc[index, "none_finals_every_machine"] = len(base)
        table.loc[index, "same_as_none_every_machine"] = (
            same_convergence(_mean(finals), _spread(finals), _mean(base), _spread(base), len(finals), len(base))
            if len(base) else "no none run")
        table.loc[index, "runs_every_machine"] = int(this.sum())
        table.loc[index, "none_runs_every_machine"] = int(none.sum())
        if row["setting"] != BASELINE_SETTING and none.any():
            gap, spread, _ = gap_at_equal_steps(rows.loc[this, "curve"], rows.loc[none, "curve"], target)
            table.loc[index, "behind_none_at_equal_steps_every_machine"] = gap
            table.loc[index, "none_spread_at_equal_steps_every_machine"] = spread


def median_if_known(times: pd.Series, unreached_floors: pd.Series) -> float:
    """The median time to target over every run, where some never met the target, if those runs cannot move it:
    each would have met it, if ever, after its floor (the seconds it trained), so where every floor is at least
    the value the median stands on with them counted last, the median is that value. NaN otherwise (more than
    half never met it, or one stopped too early to say)."""
    values = sorted(float(t) for t in times) + [math.inf] * len(unreached_floors)
    if not values:
        return math.nan
    lower, upper = values[(len(values) - 1) // 2], values[len(values) // 2]
    if math.isinf(upper) or (len(unreached_floors) and float(unreached_floors.min()) < upper):
        return math.nan
    return (lower + upper) / 2


def ratio_vs_none(base: pd.Series, row: pd.Series) -> tuple[float, float, float, str]:
    """How many times sooner than ``none`` a setting met the target: (over the medians, the least and the most
    over pairs of runs, bound). A run that did not meet it stands in with the seconds it trained, shorter
    than its time to target would have been: where only ``none`` has such runs the ratio is a floor
    (``at least``; no most over pairs), where only this setting has them a ceiling (``at most``; no least),
    and where both have them, or this setting never met it, it is unknown (NaN). Where those runs trained past the
    value each side's median stands on (:func:`median_if_known`), the ratio of the medians is known (no bound)
    and only the pairs keep theirs (the least over pairs a floor, or the most a ceiling)."""
    none_all, this_all = base["runs_reached"] == base["runs"], row["runs_reached"] == row["runs"]
    if none_all and this_all:
        # the range over every pairing of a none run with a run of this setting: a median ratio resting on
        # one early-crossing none run shows here (QCNet, H200: 3.34x median, 2.14x at the worst)
        return (_ratio(base["to_target_wall_s_median"], row["to_target_wall_s_median"]),
                _ratio(base["to_target_wall_s_min"], row["to_target_wall_s_max"]),
                _ratio(base["to_target_wall_s_max"], row["to_target_wall_s_min"]), "")
    # where the runs that never met it lie above the medians either way, the medians' ratio is known; the pairs
    # with such a run keep their bound
    known = _ratio(base["to_target_wall_s_median_all"], row["to_target_wall_s_median_all"])
    if this_all:
        floor = _ratio(base["to_target_wall_s_floor_min"], row["to_target_wall_s_max"])
        if math.isfinite(known):
            return known, floor, math.nan, ""
        return _ratio(base["to_target_wall_s_floor_median"], row["to_target_wall_s_median"]), floor, math.nan, "at least"
    if none_all and row["runs_reached"] > 0:
        ceiling = _ratio(base["to_target_wall_s_max"], row["to_target_wall_s_floor_min"])
        if math.isfinite(known):
            return known, math.nan, ceiling, ""
        return _ratio(base["to_target_wall_s_median"], row["to_target_wall_s_floor_median"]), math.nan, ceiling, "at most"
    return math.nan, math.nan, math.nan, ""


def validations_for_aim(none_first_s: float, none_between_s: float, first_s: float, between_s: float,
                        aim: float = SOONER_AIM) -> float:
    """The first validation ``k`` (1-based) from which a run with this pace, crossing a target at the same
    validation as ``none``, gets there at least ``aim`` times sooner, and stays so at every later one (the module
    docstring's formula); NaN where no validation does (the pace ratio below the aim) or a pace is unknown."""
    values = (none_first_s, none_between_s, first_s, between_s)
    if not all(math.isfinite(v) and v > 0 for v in values):
        return math.nan
    margin = none_between_s - aim * between_s  # what each later validation adds to none's lead over aim x this
    shortfall = aim * first_s - none_first_s  # what the first validation leaves to make up
    if margin < 0 or (margin == 0 and shortfall > 0):
        return math.nan
    return float(1 + max(0, math.ceil(shortfall / margin))) if margin > 0 else 1.0


def _ratio(none_s: float, this_s: float) -> float:
    """How many times sooner than none (nan where either did not reach the target)."""
    return none_s / this_s if this_s > 0 and math.isfinite(none_s) else math.nan


def too_easy(table: pd.DataFrame) -> bool:
    """Whether every run of a convergence table that met its target met it at its first validation: then
    the time to target measures how soon a run first validates, not how soon it learns."""
    reached = int(table["runs_reached"].sum()) if not table.empty else 0
    return reached > 0 and int(table["reached_at_first_validation"].sum()) == reached


def threshold_curve(scalars: pd.DataFrame, run_dir: str, target: Target) -> pd.DataFrame | None:
    """A relative target's threshold over the run's validation steps (value x reference); None if absolute."""
    if target.reference is None:
        return None
    ref = validation_curve(scalars, run_dir, target.reference)
    if ref.empty:
        return None
    return ref.assign(value=target.value * ref["value"].to_numpy(dtype=float))

