"""+experiment=convergence and the report's convergence outputs.

End to end on the CPU at test size (MapTR ``test`` on the mini set, two epochs, one seed, none and
max as a real multirun), then the report: the validation-metric plots against step and wall time
carry both runs, and the time-to-target and convergence tables list both. The rules (relative
targets, final metric over seeds, "the same convergence") are checked on hand-made tables.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from conftest import run_cli
from drivebench.report.analysis import analyse, time_to_target, with_recorded_targets
from drivebench.report.loading import load_runs
from drivebench.report.convergence import (SOONER_AIM, convergence_table, convergence_targets, followed_runs,
                                           gap_at_equal_steps, median_if_known, same_convergence, too_easy,
                                           unfollowed_targets, validation_curve, validations_for_aim)
from drivebench.perf.compile_cache import compile_cache_state
from drivebench.report.tables import convergence_display
from drivebench.perf.targets import parse_target

matplotlib.use("Agg")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ---- rules on hand-made tables -------------------------------------------------------------------
def _val_scalars(run_dir: str, values: list[float], cv: float = 12.0, epoch_s: float = 100.0,
                 steps_per_epoch: int = 250) -> pd.DataFrame:
    rows = []
    for epoch, value in enumerate(values, start=1):
        step, t = epoch * steps_per_epoch, epoch * epoch_s
        rows += [(run_dir, "train", "val/minFDE", step, value, t, t), (run_dir, "train", "val/cv_minFDE", step, cv, t, t)]
    return pd.DataFrame(rows, columns=["run_dir", "phase", "tag", "step", "value", "wall_time", "elapsed_s"])


def test_relative_target_is_met_against_the_reference_logged_at_the_same_step():
    target = parse_target("val/minFDE <= 0.5 * val/cv_minFDE")
    assert (target.metric, target.op, target.value, target.reference) == ("val/minFDE", "<=", 0.5, "val/cv_minFDE")
    assert target.label == "val/minFDE<=0.5*val/cv_minFDE"
    assert target.met(5.9, 12.0) and not target.met(6.1, 12.0) and not target.met(1.0, None)
    scalars = _val_scalars("a", [10.0, 6.0, 4.0]).drop(columns="run_dir")
    assert time_to_target(scalars, target) == {"state": "reached", "step": 500.0, "elapsed_s": 200.0}
    assert time_to_target(scalars, parse_target("minFDE<=0.2*cv_minFDE"))["state"] == "not reached"
    no_reference = scalars[scalars["tag"] != "val/cv_minFDE"]
    assert time_to_target(no_reference, target)["state"] == "no series"
    with pytest.raises(ValueError, match="FACTOR\\*OTHER_METRIC"):
        parse_target("val/minFDE<=half*val/cv_minFDE")


def _runs(specs: list[tuple[str, str, int, list[float], float]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(run_dir, setting, seed, val curve, seconds per epoch) -> runs and scalars as load_runs gives them."""
    runs = pd.DataFrame([{
        "run": d, "run_dir": d, "machine": "1x NVIDIA H200 @ h200", "model": "qcnet", "model_size": "paper",
        "data": "argoverse2", "bench": "train", "setting": setting, "seed": float(seed), "job_num": float(i),
        "started": "2026-01-01", "throughput_median": 10.0, "targets": "val/minFDE<=0.5*val/cv_minFDE"}
        for i, (d, setting, seed, _, _) in enumerate(specs)])
    scalars = pd.concat([_val_scalars(d, curve, epoch_s=s) for d, _, _, curve, s in specs], ignore_index=True)
    return runs, scalars


def test_convergence_table_final_metric_over_seeds_time_to_target_and_the_same_convergence_rule():
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0, 5.8, 5.0], 90.0), ("n2", "none", 2024, [9.5, 7.5, 5.9, 5.4], 95.0),
                           ("m1", "max", 2023, [9.1, 7.1, 5.7, 5.2], 30.0), ("m2", "max", 2024, [9.2, 6.9, 5.6, 5.1], 31.0),
                           ("f1", "fast_but_worse", 2023, [9.0, 8.0, 7.5, 7.0], 10.0),
                           ("f2", "fast_but_worse", 2024, [9.0, 8.1, 7.6, 7.1], 10.0)])
    targets = with_recorded_targets([], runs)
    assert [t.label for t in targets] == ["val/minFDE<=0.5*val/cv_minFDE"]
    analysed = analyse(runs, scalars, targets)
    assert convergence_targets(analysed, scalars, targets) == targets
    table = convergence_table(analysed, scalars, targets[0]).set_index("setting")
    assert table.loc["none", "seeds"] == "2023,2024" and table.loc["none", "runs"] == 2
    assert table.loc["none", "final_mean"] == pytest.approx(5.2)
    assert table.loc["none", "final_spread"] == pytest.approx(0.4)
    # the target (6.0) is met at epoch 3 by every none and max run, never by the worse setting
    assert table.loc["none", "reached"] == "2/2" and table.loc["fast_but_worse", "reached"] == "0/2"
    assert table.loc["none", "to_target_wall_s_median"] == pytest.approx((270.0 + 285.0) / 2)
    assert table.loc["max", "to_target_wall_s_median"] == pytest.approx((90.0 + 93.0) / 2)
    assert table.loc["max", "to_target_steps_median"] == 750
    assert table.loc["max", "wall_s_vs_none"] == pytest.approx(277.5 / 91.5)
    # over every pairing of a none run with a max run: the fastest none against the slowest max, and back
    assert table.loc["max", "wall_s_vs_none_min"] == pytest.approx(270.0 / 93.0)
    assert table.loc["max", "wall_s_vs_none_max"] == pytest.approx(285.0 / 90.0)
    assert table.loc["none", "wall_s_vs_none_min"] == pytest.approx(270.0 / 285.0)
    shown = convergence_display(table.reset_index()).set_index("setting")
    assert shown.loc["max", "time to target, none / this [over pairs of runs]"] == "3.03x [2.9-3.17]"
    assert table.loc["max", "same_as_none"] == "yes"            # |5.15 - 5.2| <= 0.4
    assert table.loc["fast_but_worse", "same_as_none"] == "no"  # |7.05 - 5.2| > 0.4
    assert math.isnan(table.loc["fast_but_worse", "wall_s_vs_none"])
    assert math.isnan(table.loc["fast_but_worse", "wall_s_vs_none_min"])
    assert shown.loc["fast_but_worse", "time to target, none / this [over pairs of runs]"] == ""
    assert shown.loc["max", "of which validating"] == "-"  # summaries from before train.validation


def test_convergence_table_says_how_much_of_the_pace_is_validating():
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0, 5.8], 90.0), ("m1", "max", 2023, [9.1, 7.1, 5.7], 30.0),
                           ("m2", "max", 2024, [9.2, 6.9, 5.6], 31.0)])
    runs["validation_first_s"] = [20.0, 15.0, 17.0]
    runs["validation_s_median"] = [14.0, 6.0, 7.0]
    target = with_recorded_targets([], runs)[0]
    table = convergence_table(analyse(runs, scalars, [target]), scalars, target).set_index("setting")
    assert table.loc["max", "validation_first_s_median"] == pytest.approx(16.0)
    assert table.loc["max", "validation_s_median"] == pytest.approx(6.5)
    shown = convergence_display(table.reset_index()).set_index("setting")
    assert shown.loc["none", "of which validating"] == "first 20 s, then 14 s each"
    assert shown.loc["max", "of which validating"] == "first 16 s, then 6.5 s each"


def test_convergence_table_says_how_much_of_the_time_to_target_was_compiling_and_from_which_cache():
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0, 5.8], 90.0), ("n2", "none", 2024, [9.5, 7.5, 5.9], 95.0),
                           ("m1", "max", 2023, [9.1, 5.7, 5.2], 60.0), ("m2", "max", 2024, [9.2, 5.6, 5.1], 30.0)])
    reports = {"n1": None, "n2": None,
               "m1": {"compile_s": {"total": 160.0}, "fx_graph_cache": {"hits": 2, "misses": 40}},  # H200, b33
               "m2": {"compile_s": {"total": 40.0}, "fx_graph_cache": {"hits": 36, "misses": 6}}}
    runs = runs.assign(compile_s=[(reports[d] or {}).get("compile_s", {}).get("total", math.nan) for d in runs["run_dir"]],
                       compile_cache=[compile_cache_state(reports[d]) for d in runs["run_dir"]])
    assert [None if pd.isna(v) else v for v in runs["compile_cache"]] == [None, None, "cold", "warm"]
    assert compile_cache_state({"fx_graph_cache": {"hits": 3, "misses": 2}}) == "partly warm"
    assert compile_cache_state({"fx_graph_cache": {"hits": 0, "misses": 0}}) is None
    targets = with_recorded_targets([], runs)
    analysed = analyse(runs, scalars, targets)
    table = convergence_table(analysed, scalars, targets[0]).set_index("setting")
    assert table.loc["max", "compile_s_median"] == pytest.approx(100.0)
    assert table.loc["max", "compile_cache"] == "cold / warm"
    assert math.isnan(table.loc["none", "compile_s_median"]) and pd.isna(table.loc["none", "compile_cache"])
    shown = convergence_display(table.reset_index()).set_index("setting")
    assert shown.loc["max", "of which compiling"] == "100 s (cold / warm cache)"
    assert shown.loc["none", "of which compiling"] == "-"


def test_convergence_table_gives_the_pace_first_validation_then_between_validations():
    """A setting that starts late (a compile before its first step) but validates more often: the pace columns say
    what a longer schedule approaches (SparseDrive on an H100: first validation at 72.5 s, then every 22.6 s against
    none's 70.6 s: 3.12x epoch for epoch where its time to target was 1.91x)."""
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0, 5.8, 5.0], 90.0), ("n2", "none", 2024, [9.5, 7.5, 5.9, 5.4], 94.0),
                           ("m1", "max", 2023, [9.1, 7.1, 5.7, 5.2], 30.0), ("m2", "max", 2024, [9.2, 6.9, 5.6, 5.1], 32.0)])
    late = scalars["run_dir"].isin(["m1", "m2"])
    scalars.loc[late, ["elapsed_s", "wall_time"]] += 60.0  # max's one-time start
    targets = with_recorded_targets([], runs)
    table = convergence_table(analyse(runs, scalars, targets), scalars, targets[0]).set_index("setting")
    assert table.loc["none", "first_validation_s_median"] == pytest.approx(92.0)
    assert table.loc["none", "between_validations_s_median"] == pytest.approx(92.0)
    assert table.loc["max", "first_validation_s_median"] == pytest.approx(91.0)
    assert table.loc["max", "between_validations_s_median"] == pytest.approx(31.0)
    assert table.loc["max", "between_validations_vs_none"] == pytest.approx(92.0 / 31.0)
    assert table.loc["max", "wall_s_vs_none"] == pytest.approx((270.0 + 282.0) / 2 / (150.0 + 156.0) * 2)
    shown = convergence_display(table.reset_index()).set_index("setting")
    column = "first validation, then between validations (none / this)"
    assert shown.loc["max", column] == "91 s, then every 31 s (2.97x; under 3x on any longer schedule)"
    assert shown.loc["none", column] == "92 s, then every 92 s"
    assert math.isnan(table.loc["max", "validations_for_aim"])


def test_the_validation_from_which_a_late_starting_setting_is_3x_sooner():
    """QCNet's paces on one H100, rounded (b52: max first validates at 38.8 s, then every 18.2 s; none at 57.3 s,
    then every 56.5 s): crossing at the same validation, max is 3x sooner only from validation 33 on (35 from the
    unrounded medians), where its target falls at the third. The figure is the first validation where the ratio
    reaches the aim and it holds at every later one."""
    def ratio(k: int, none_first: float, none_between: float, first: float, between: float) -> float:
        return (none_first + (k - 1) * none_between) / (first + (k - 1) * between)

    for paces, expected in (((57.3, 56.5, 38.8, 18.2), 33), ((64.0, 60.0, 35.0, 17.0), 6), ((300.0, 50.0, 20.0, 10.0), 1)):
        k = validations_for_aim(*paces)
        assert k == expected
        assert all(ratio(j, *paces) >= SOONER_AIM for j in range(int(k), int(k) + 200))
        assert k == 1 or ratio(int(k) - 1, *paces) < SOONER_AIM
    assert math.isnan(validations_for_aim(70.6, 70.6, 49.8, 24.6))  # SparseDrive's pace, 2.87x: no schedule
    assert math.isnan(validations_for_aim(100.0, 30.0, 10.0, 20.0))  # 10x at the first validation, 1.5x later on
    assert math.isnan(validations_for_aim(57.3, math.nan, 38.8, 18.2))  # one validation: no pace to go by
    assert validations_for_aim(60.0, 60.0, 20.0, 20.0) == 1  # exactly the aim at every validation


def test_a_lag_at_every_validation_shows_at_equal_steps_where_the_finals_rule_lets_it_pass():
    """QCNet's max trails none by ~0.2 m of minFDE at every epoch while its finals sit inside none's seed spread:
    the gap at equal steps (mean over the validations both logged, signed so that behind is positive for a
    lower-is-better target) shows the lag the finals rule cannot, next to none's spread at those steps."""
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0, 5.8, 5.0], 90.0), ("n2", "none", 2024, [9.4, 7.4, 6.0, 5.6], 95.0),
                           ("m1", "max", 2023, [9.4, 7.4, 6.1, 5.3], 30.0), ("m2", "max", 2024, [9.6, 7.6, 6.3, 5.5], 31.0),
                           ("m3", "max", 2025, [9.5, 7.5], 30.0)])  # stopped after two epochs: its two steps count
    runs.loc[runs["run"] == "m3", "status"] = "interrupted"
    targets = with_recorded_targets([], runs)
    followed = followed_runs(analyse(runs[runs["run"] != "m3"], scalars, targets), runs[runs["run"] == "m3"],
                             scalars, targets)
    table = convergence_table(followed.runs, followed.scalars, targets[0]).set_index("setting")
    assert table.loc["max", "same_as_none"] == "yes"  # |5.4 - 5.3| <= 0.6: the finals rule sees no difference
    # per step, max's mean minus none's: 9.5-9.2, 7.5-7.2, 6.2-5.9, 5.4-5.3
    assert table.loc["max", "behind_none_at_equal_steps"] == pytest.approx((0.3 + 0.3 + 0.3 + 0.1) / 4)
    assert table.loc["max", "none_spread_at_equal_steps"] == pytest.approx((0.4 + 0.4 + 0.2 + 0.6) / 4)
    assert table.loc["max", "equal_steps"] == 4
    assert math.isnan(table.loc["none", "behind_none_at_equal_steps"])
    shown = convergence_display(table.reset_index()).set_index("setting")
    column = "metric at equal steps, this vs none (mean over validations)"
    assert shown.loc["max", column] == "0.25 behind (none's seed spread 0.4) over 4 validations"
    assert shown.loc["none", column] == "-"
    # a higher-is-better target flips the sign: the same curves are ahead of none there
    # a higher-is-better target flips the sign (mAP 2.0 against none's 1.0 and 1.5: 0.75 ahead); one none run has
    # no spread; steps only one side logged do not count
    assert gap_at_equal_steps(pd.Series([{48: 2.0, 96: 3.0}]), pd.Series([{48: 1.0}, {48: 1.5}]),
                              parse_target("val/mAP>=0.5")) == (pytest.approx(-0.75), pytest.approx(0.5), 1)
    gap, spread, steps = gap_at_equal_steps(pd.Series([{48: 2.0}]), pd.Series([{48: 1.0}]), targets[0])
    assert (gap, steps) == (pytest.approx(1.0), 1) and math.isnan(spread)


def test_finals_pool_over_machines_where_the_numerics_changes_are_the_same():
    """An H100 with one none seed cannot judge the finals rule; with the H200's two none seeds it can. A CPU's
    max (fp32, no compile: other numerics) does not pool with the GPUs' max, while every none pools."""
    runs, scalars = _runs([("h100n", "none", 2024, [9.5, 7.5, 5.9, 5.4], 95.0),
                           ("h100m1", "max", 2023, [9.1, 7.1, 5.7, 5.3], 30.0),
                           ("h100m2", "max", 2025, [9.2, 6.9, 5.6, 5.1], 31.0),
                           ("h200n1", "none", 2023, [9.0, 7.0, 5.8, 5.0], 90.0),
                           ("h200n2", "none", 2025, [9.4, 7.4, 6.0, 5.6], 92.0),
                           ("cpum", "max", 2023, [9.9, 9.0, 8.5, 8.0], 300.0)])
    runs["machine"] = ["1x NVIDIA H100 @ vm"] * 3 + ["1x NVIDIA H200 @ vm"] * 2 + ["cpu (2 cores) @ box"]
    gpu_max = "precision=bf16-mixed, tf32, compile"
    runs["numerics_changed_by"] = ["", gpu_max, gpu_max, "", "", ""]
    targets = with_recorded_targets([], runs)
    table = convergence_table(analyse(runs, scalars, targets), scalars, targets[0])
    h100 = table[table["machine"].str.contains("H100")].set_index("setting")
    assert h100.loc["max", "same_as_none"] == "one seed: no spread to judge by"
    assert (h100.loc["max", "finals_every_machine"], h100.loc["max", "none_finals_every_machine"]) == (2, 3)
    assert h100.loc["max", "final_mean_every_machine"] == pytest.approx(5.2)   # the CPU's 8.0 is not pooled
    assert h100.loc["max", "same_as_none_every_machine"] == "yes"              # |5.2 - 5.333| <= 0.6
    cpu = table[table["machine"].str.startswith("cpu")].set_index("setting")
    assert cpu.loc["max", "finals_every_machine"] == 1 and cpu.loc["max", "same_as_none"] == "no none run"
    assert cpu.loc["max", "same_as_none_every_machine"] == "one seed: no spread to judge by"
    shown = convergence_display(table).set_index(["machine", "setting"])["final within the seed spread of none"]
    assert shown[("1x NVIDIA H100 @ vm", "max")] == ("one seed: no spread to judge by; over every machine "
                                                     "(3 none, 2 this): yes")
    assert shown[("1x NVIDIA H100 @ vm", "none")] == table.set_index(["machine", "setting"]).loc[
        ("1x NVIDIA H100 @ vm", "none"), "same_as_none"]  # none keeps its own verdict


def test_a_run_stopped_early_counts_its_time_to_target_but_has_no_final_metric():
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0, 5.8, 5.0], 90.0), ("n2", "none", 2024, [9.5, 7.5, 5.9, 5.4], 95.0),
                           ("n3", "none", 2025, [9.4, 7.4], 92.0),            # stopped in epoch 3: never met 6.0
                           ("m1", "max", 2023, [9.1, 7.1, 5.7, 5.2], 30.0), ("m2", "max", 2024, [9.2, 5.6, 5.3], 31.0)])
    stopped = runs[runs["run_dir"].isin(["n3", "m2"])]   # m2 stopped in epoch 4, after meeting the target in epoch 2
    done = runs[~runs["run_dir"].isin(["n3", "m2"])]
    targets = with_recorded_targets([], runs)
    followed = followed_runs(analyse(done, scalars, targets), stopped, scalars, targets).runs
    assert sorted(followed.loc[followed["stopped"], "run_dir"]) == ["m2", "n3"]
    assert followed["setting"].iloc[0] == "none"                      # the report's order: the baseline first
    table = convergence_table(followed, scalars, targets[0]).set_index("setting")
    assert table.loc["none", "runs"] == 3 and table.loc["none", "finals"] == 2
    assert table.loc["none", "final_mean"] == pytest.approx(5.2)      # n3's last validation is not a final
    assert table.loc["none", "reached"] == "2/3" and table.loc["none", "stopped_before_target"] == 1
    assert table.loc["max", "reached"] == "2/2" and table.loc["max", "stopped_before_target"] == 0
    assert table.loc["max", "to_target_wall_s_median"] == pytest.approx((90.0 + 62.0) / 2)  # m2's epoch 2 counts
    assert table.loc["max", "finals"] == 1 and table.loc["max", "final_mean"] == pytest.approx(5.2)
    assert table.loc["max", "same_as_none"] == "one seed: no spread to judge by"  # one final of max
    shown = convergence_display(table.reset_index()).set_index("setting")
    assert shown.loc["none", "reached"] == "2/3 (1 stopped before it)"
    assert shown.loc["max", "final (mean [min-max])"] == "5.2"


def test_a_run_stopped_after_its_last_scheduled_step_keeps_its_last_validation_as_its_final():
    """A cap's signal in the end-of-run validation (b48, H100: three SparseDrive runs) comes after the schedule's
    last step and its validation: that validation is the run's final. A run stopped one epoch short is not final,
    nor is one whose summary predates ``run.schedule_steps``."""
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0, 5.8, 5.0], 90.0), ("n2", "none", 2024, [9.5, 7.5, 5.9, 5.4], 95.0),
                           ("m1", "max", 2023, [9.1, 7.1, 5.7, 5.2], 30.0),   # stopped after step 1000 of 1000
                           ("m2", "max", 2024, [9.2, 6.9, 5.6], 31.0),        # stopped in epoch 4 of 4
                           ("m3", "max", 2025, [9.0, 7.0, 5.5, 5.3], 30.0)])  # stopped at the end, an older summary
    runs["schedule_steps"] = [1000.0, 1000.0, 1000.0, 1000.0, math.nan]
    stopped, done = runs[runs["setting"] == "max"], runs[runs["setting"] == "none"]
    targets = with_recorded_targets([], runs)
    followed = followed_runs(analyse(done, scalars, targets), stopped, scalars, targets).runs
    table = convergence_table(followed, scalars, targets[0]).set_index("setting")
    assert table.loc["max", "runs"] == 3 and table.loc["max", "finals"] == 1
    assert table.loc["max", "final_mean"] == pytest.approx(5.2)  # m1's last validation; m2 and m3 have none


def test_a_run_that_never_met_the_target_bounds_the_ratio_on_its_side():
    """A none run capped at 300 s never met the target: it would have, if ever, later than 300 s, so max's
    ratio is at least 300 s over max's median (and at least 300 s over max's slowest for every pair); a max
    run cut before it makes the ratio a ceiling the same way."""
    runs, scalars = _runs([("n1", "none", 2024, [9.5, 7.5, 7.0], 100.0),            # cut at 300 s, above 6.0
                           ("m1", "max", 2023, [9.1, 5.7, 5.2], 30.0), ("m2", "max", 2024, [9.2, 5.6, 5.3], 31.0)])
    stopped, done = runs[runs["run_dir"] == "n1"], runs[runs["run_dir"] != "n1"]
    targets = with_recorded_targets([], runs)
    followed = followed_runs(analyse(done, scalars, targets), stopped, scalars, targets).runs
    table = convergence_table(followed, scalars, targets[0]).set_index("setting")
    assert table.loc["none", "not_reached_by_s"] == 300.0 and math.isnan(table.loc["max", "not_reached_by_s"])
    assert table.loc["max", "wall_s_vs_none_bound"] == "at least"
    assert table.loc["max", "wall_s_vs_none"] == pytest.approx(300.0 / 61.0)       # max met it at 60 and 62 s
    assert table.loc["max", "wall_s_vs_none_min"] == pytest.approx(300.0 / 62.0)
    assert math.isnan(table.loc["max", "wall_s_vs_none_max"])                      # no ceiling
    shown = convergence_display(table.reset_index()).set_index("setting")
    assert shown.loc["max", "time to target, none / this [over pairs of runs]"] == "at least 4.92x [pairs: at least 4.84x]"
    assert shown.loc["none", "to target (median over seeds)"] == "not reached before the stop (in 300 s)"
    # a none run that reached it beside one that did not: the cut run stands in with its 300 s
    runs, scalars = _runs([("n1", "none", 2024, [9.5, 7.5, 7.0], 100.0), ("n2", "none", 2023, [9.0, 5.9, 5.5], 90.0),
                           ("n3", "none", 2025, [9.0, 7.0, 5.9], 95.0),
                           ("m1", "max", 2023, [9.1, 5.7, 5.2], 30.0), ("m2", "max", 2024, [9.2, 7.6, 5.3], 31.0)])
    stopped, done = runs[runs["run_dir"] == "n1"], runs[runs["run_dir"] != "n1"]
    followed = followed_runs(analyse(done, scalars, targets), stopped, scalars, targets).runs
    table = convergence_table(followed, scalars, targets[0]).set_index("setting")
    assert table.loc["max", "wall_s_vs_none"] == pytest.approx(285.0 / 76.5)        # median of 180, 285, 300 s
    assert table.loc["max", "wall_s_vs_none_bound"] == ""  # the cut run trained past 285 s: the median is known
    assert median_if_known(pd.Series([1.0, 2.0, 3.0]), pd.Series([10.0])) == 2.5     # counted last: (2 + 3) / 2
    assert math.isnan(median_if_known(pd.Series([1.0, 2.0, 3.0]), pd.Series([2.5])))  # it might have come first
    assert math.isnan(median_if_known(pd.Series([1.0]), pd.Series([5.0, 6.0])))       # most never met it
    assert table.loc["max", "wall_s_vs_none_min"] == pytest.approx(180.0 / 93.0)
    # the other way round (b44, H100: a max run cut before the target): its seconds make the ratio a ceiling
    runs, scalars = _runs([("n1", "none", 2024, [9.5, 7.5, 5.5], 57.0),
                           ("m1", "max", 2023, [9.1, 7.7, 7.2, 5.2], 30.0), ("m2", "max", 2025, [9.2, 7.6, 7.3, 5.3], 31.0),
                           ("m3", "max", 2024, [9.3], 101.0)])            # cut at 101 s, after one validation
    stopped, done = runs[runs["run_dir"] == "m3"], runs[runs["run_dir"] != "m3"]
    followed = followed_runs(analyse(done, scalars, targets), stopped, scalars, targets).runs
    table = convergence_table(followed, scalars, targets[0]).set_index("setting")
    assert table.loc["max", "reached"] == "2/3" and table.loc["max", "wall_s_vs_none_bound"] == "at most"
    # max: 120 and 124 s, and the cut run's 101 s, a floor below them: it might have met it first
    assert table.loc["max", "wall_s_vs_none"] == pytest.approx(171.0 / 120.0)
    assert table.loc["max", "wall_s_vs_none_max"] == pytest.approx(171.0 / 101.0)
    assert math.isnan(table.loc["max", "wall_s_vs_none_min"])                      # no floor
    shown = convergence_display(table.reset_index()).set_index("setting")
    assert shown.loc["max", "time to target, none / this [over pairs of runs]"] == "at most 1.43x [pairs: at most 1.69x]"
    # a max run cut after the others had met it (178 s): wherever it would have met it, the median over the three
    # stands on 124 s, so the medians' ratio is known; only its pairs stay ceilings (MapTR nano, three H100s: one
    # max run of nine never met mAP 0.05 in its 36 s, above the 30.4-s median)
    runs, scalars = _runs([("n1", "none", 2024, [9.5, 7.5, 5.5], 57.0),
                           ("m1", "max", 2023, [9.1, 7.7, 7.2, 5.2], 30.0), ("m2", "max", 2025, [9.2, 7.6, 7.3, 5.3], 31.0),
                           ("m3", "max", 2024, [9.3, 8.0, 7.5, 7.0], 44.5)])  # its schedule ended above the target
    table = convergence_table(analyse(runs, scalars, targets), scalars, targets[0]).set_index("setting")
    assert table.loc["max", "reached"] == "2/3" and table.loc["max", "wall_s_vs_none_bound"] == ""
    assert table.loc["max", "wall_s_vs_none"] == pytest.approx(171.0 / 124.0)
    shown = convergence_display(table.reset_index()).set_index("setting")
    assert shown.loc["max", "time to target, none / this [over pairs of runs]"] == "1.38x [pairs: at most 1.43x]"
    assert shown.loc["max", "to target (median over seeds)"] == "122 s, step 1000 (over the 2 that met it; over all 3: 124 s)"
    # a setting with a run that did not meet it either: neither side of the ratio is known
    runs, scalars = _runs([("n1", "none", 2024, [9.5, 7.5, 7.0], 100.0),
                           ("m1", "max", 2023, [9.1, 5.7, 5.2], 30.0), ("m2", "max", 2024, [9.2, 7.6, 7.3], 31.0)])
    followed = followed_runs(analyse(runs.iloc[1:], scalars, targets), runs.iloc[:1], scalars, targets).runs
    table = convergence_table(followed, scalars, targets[0]).set_index("setting")
    assert math.isnan(table.loc["max", "wall_s_vs_none"]) and table.loc["max", "wall_s_vs_none_bound"] == ""


def test_a_resumed_run_is_one_run_on_one_clock():
    """Seed 2023 stopped after two epochs (180 s of training) and continued from its checkpoint in a new
    folder (its own clock restarts; the same run id): one run, its later validations 180 s later."""
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0], 90.0), ("n1b", "none", 2023, [5.8, 5.0], 95.0),
                           ("n2", "none", 2024, [9.5, 7.5, 5.9, 5.4], 95.0)])
    runs = runs.assign(run_id=["aaa", "aaa", "bbb"], started=["2026-01-01T00:00", "2026-01-01T01:00", "2026-01-01T00:00"],
                       compile_s=[30.0, 12.0, 31.0])
    later = scalars["run_dir"] == "n1b"  # the continuation logged epochs 3 and 4 (steps 750, 1000) from its own start
    scalars.loc[later, "step"] += 500
    targets = with_recorded_targets([], runs)
    stopped, done = runs[runs["run_dir"] == "n1"], runs[runs["run_dir"] != "n1"]
    followed = followed_runs(analyse(done, scalars, targets), stopped, scalars, targets)
    rows = followed.runs.set_index("run_dir")
    assert sorted(rows.index) == ["n1b", "n2"] and rows.loc["n1b", "segments"] == 2 and not rows.loc["n1b", "stopped"]
    label = targets[0].label
    assert rows.loc["n1b", f"to {label} steps"] == 750 and rows.loc["n1b", f"to {label} wall_s"] == pytest.approx(180 + 95)
    table = convergence_table(followed.runs, followed.scalars, targets[0]).set_index("setting")
    assert table.loc["none", "runs"] == 2 and table.loc["none", "reached"] == "2/2"
    assert table.loc["none", "final_mean"] == pytest.approx((5.0 + 5.4) / 2)
    assert rows.loc["n1b", "compile_s"] == 42.0  # both processes compiled
    curve = validation_curve(followed.scalars, "n1b", "val/minFDE")
    assert curve["step"].tolist() == [250, 500, 750, 1000] and curve["elapsed_s"].tolist() == [90, 180, 275, 370]


def test_with_every_run_stopped_early_the_table_says_so():
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0], 90.0), ("m1", "max", 2023, [9.1, 5.7], 30.0)])
    targets = with_recorded_targets([], runs)
    followed = followed_runs(analyse(runs.iloc[:0], scalars, targets), runs, scalars, targets).runs
    shown = convergence_display(convergence_table(followed, scalars, targets[0])).set_index("setting")
    assert shown.loc["none", "to target (median over seeds)"] == "not reached before the stop (in 180 s)"
    assert shown.loc["max", "time to target, none / this [over pairs of runs]"] == "at least 3x"  # 180 s / 60 s
    assert shown.loc["max", "to target (median over seeds)"] == "60 s, step 500"
    assert shown.loc["max", "final (mean [min-max])"] == "- (every run stopped early)"
    assert shown.loc["max", "final within the seed spread of none"] == "no final metric"


def test_a_target_met_at_the_first_validation_is_flagged_as_too_easy():
    runs, scalars = _runs([("n1", "none", 2023, [5.0, 4.0], 90.0), ("m1", "max", 2023, [5.5, 4.2], 30.0)])
    easy, hard = parse_target("val/minFDE<=0.5*val/cv_minFDE"), parse_target("val/minFDE<=0.35*val/cv_minFDE")
    analysed = analyse(runs, scalars, [easy, hard])
    table = convergence_table(analysed, scalars, easy).set_index("setting")
    assert table["reached_at_first_validation"].tolist() == [1, 1] and too_easy(table)  # 5.0, 5.5 <= 6.0 at step 250
    assert convergence_display(table.reset_index())["reached"].tolist() == ["1/1 (1 at the first validation)"] * 2
    table = convergence_table(analysed, scalars, hard).set_index("setting")  # 4.2 > 4.0 >= 4.0: none at epoch 2 only
    assert table["reached_at_first_validation"].tolist() == [0, 0] and not too_easy(table)
    assert table.loc["none", "reached"] == "1/1" and table.loc["max", "reached"] == "0/1"


def test_a_target_no_run_logged_is_named_with_the_closest_metrics():
    runs, scalars = _runs([("n1", "none", 2023, [9.0, 7.0], 90.0)])
    targets = [parse_target("val/minFDE<=6.0"), parse_target("val/minFD<=6.0"), parse_target("minFDE<=0.5*cv_minFD")]
    lines = unfollowed_targets(runs, scalars, targets)
    assert lines == ["val/minFD<=6.0: no run that validated during training logged val/minFD, so it has no convergence "
                     "table; did you mean val/minFDE or val/cv_minFDE?",
                     "minFDE<=0.5*cv_minFD: no run that validated during training logged cv_minFD, so it has no "
                     "convergence table; did you mean val/cv_minFDE or val/minFDE?"]
    assert unfollowed_targets(runs.iloc[:0], scalars, targets) == []  # nothing validated: nothing to say


def test_same_convergence_needs_two_seeds_of_each_setting():
    assert same_convergence(5.0, math.nan, 5.0, 0.3, 1, 2) == "one seed: no spread to judge by"
    assert same_convergence(5.0, 0.1, 5.25, 0.3, 2, 2) == "yes"
    assert same_convergence(5.0, 0.1, 5.35, 0.3, 2, 2) == "no"
    assert same_convergence(math.nan, 0.1, 5.0, 0.3, 2, 2) == "no final metric"


# ---- the experiment, end to end on the CPU ----------------------------------------------------------
@pytest.fixture(scope="module")
def sweep(tmp_path_factory, drivebench_cache) -> Path:
    sweep_dir = tmp_path_factory.mktemp("convergence") / "sweep"
    result = run_cli(["-m", "+experiment=convergence", "model=maptr", "seed=2023", "trainer.max_epochs=2",
                      "bench.warmup_steps=2", "model.batch_size=2", "model.val_batch_size=2",
                      f"hydra.sweep.dir={sweep_dir}"], drivebench_cache, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return sweep_dir


def _val_loss(run_dir: Path) -> pd.DataFrame:
    """val/loss logged while training (``fit/val/loss`` of the run's event stream), read with tbparse
    (independently of the report)."""
    from tbparse import SummaryReader

    frames = [SummaryReader(str(f)).scalars for f in sorted((run_dir / "tb").glob("events.out.tfevents.*"))]
    data = pd.concat(frames)
    return data[data["tag"] == "fit/val/loss"].sort_values("step")


def test_convergence_sweep_report_plots_and_tables_carry_both_runs(sweep, tmp_path, capsys):
    from drivebench.report.cli import main

    summaries = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/summary.json")}
    assert sorted(s["run"]["accel"] for s in summaries.values()) == ["max", "none"]
    for summary in summaries.values():
        assert summary["targets"] == ["val/mAP>=0.05"]         # the model's target, recorded by the run
        assert summary["config"]["trainer"]["check_val_every_n_epoch"] == 1
        assert summary["run"]["seed"] == 2023
        validation = summary["train"]["validation"]            # the fit's two validations, where their time went
        assert validation["runs"] == 2 and validation["steps"] == [5, 10] and validation["batches"] >= 1
        assert validation["wall_s"]["n"] == 1 and validation["total_s"] >= validation["first_s"] > 0
        assert validation["forward_s"]["median"] > 0 and validation["first_wait_s"]["n"] == 1
    none_dir = next(sweep / n for n, s in summaries.items() if s["run"]["accel"] == "none")
    curve = _val_loss(none_dir)
    assert len(curve) == 2                                     # one validation per epoch
    threshold = float(curve["value"].max())                    # met at the first epoch's validation
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out), f"--target=val/loss<={threshold!r}"]) == 0
    stdout = capsys.readouterr().out

    for name in ("convergence_vs_step", "convergence_vs_time", "time_to_target"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG_SIGNATURE
    table = pd.read_csv(out / "report.csv").set_index("setting")
    label = f"val/loss<={threshold!r}"
    assert table.loc["none", f"to {label} state"] == "reached"
    assert table.loc["none", f"to {label} steps"] == int(curve["step"].iloc[0])
    assert set(table[f"to val/mAP>=0.05 state"]) <= {"reached", "not reached"}  # the recorded target, both runs
    convergence = pd.read_csv(out / "convergence.csv")
    for target in (label, "val/mAP>=0.05"):
        assert sorted(convergence.loc[convergence["target"] == target, "setting"]) == ["max", "none"]
    # both validated after each of their two epochs: max's metric is compared with none's at both steps
    max_loss = convergence[(convergence["target"] == label) & (convergence["setting"] == "max")].iloc[0]
    assert max_loss["equal_steps"] == 2 and math.isfinite(max_loss["behind_none_at_equal_steps"])
    md = (out / "report.md").read_text()
    assert f"## Convergence: {label}" in md and "## Convergence: val/mAP>=0.05" in md
    assert "![convergence_vs_time](convergence_vs_time.png)" in md
    assert "convergence: val/mAP>=0.05" in stdout


def test_the_convergence_plot_draws_one_curve_per_run(sweep):
    from drivebench.report import analysed
    from drivebench.report.plots import convergence_figure

    runset, runs = analysed([sweep], [])
    targets = with_recorded_targets([], runs)
    for x in ("step", "elapsed_s"):
        fig = convergence_figure(runs, runset.scalars, targets, x)
        labels = [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
        runs_drawn = [lab for lab in labels if "seed 2023" in lab]
        assert sorted(lab.split()[0] for lab in runs_drawn) == ["max", "none"]
        assert any(lab.startswith("target") for lab in labels)
        for line in fig.axes[0].get_lines():
            if "seed 2023" in str(line.get_label()):
                assert len(line.get_xdata()) == 2              # both epochs' validations


def test_a_convergence_job_stopped_by_a_signal_still_reports_its_curve(sweep, tmp_path, capsys):
    """The report of a folder holding only runs a time cap stopped: their validation curves, the
    convergence table and plots, exit 0; the runs stay listed as interrupted (no throughput table)."""
    from drivebench.report.cli import main

    runs = tmp_path / "runs"
    for src in sweep.glob("*/summary.json"):
        dst = runs / src.parent.name
        shutil.copytree(src.parent, dst)
        summary = json.loads((dst / "summary.json").read_text())
        summary["run"].update(status="interrupted",  # what drivebench.signals writes on SIGTERM
                              interrupted={"signal": "SIGTERM", "exit_code": 143, "step": 9, "checkpoint": None})
        assert summary["run"]["schedule_steps"] == 10  # two epochs of 5 steps ran; say they were 2 of 4
        summary["run"]["schedule_steps"] = 20
        (dst / "summary.json").write_text(json.dumps(summary))
    label = f"val/loss<={float(_val_loss(next(runs.glob('*none*'))).iloc[0]['value'])!r}"
    out = tmp_path / "report"
    assert main([str(runs), f"report.out={out}", f"--target={label}"]) == 0
    text = capsys.readouterr().out
    convergence = pd.read_csv(out / "convergence.csv")
    mine = convergence[convergence["target"] == label].set_index("setting")
    assert sorted(mine.index) == ["max", "none"] and (mine["finals"] == 0).all()
    assert mine.loc["none", "reached"] == "1/1"
    for name in ("convergence_vs_step", "convergence_vs_time"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG_SIGNATURE
    assert not (out / "report.csv").read_text().strip() and not (out / "throughput.png").exists()  # no completed run
    md = (out / "report.md").read_text()
    assert f"## Convergence: {label}" in md and "- (every run stopped early)" in md
    assert md.count("| interrupted |") == 2 and "convergence tables" in text


def test_a_convergence_job_stopped_and_resumed_is_one_run_on_one_clock(tmp_path, drivebench_cache, capsys):
    """SIGTERM after the first epoch's checkpoint (at the next step boundary, mid-epoch 2), then resume=auto in
    a new folder: the report follows one run of three epochs, its clock the two processes' training time."""
    from drivebench.report.cli import main
    from test_ckpt_cli_helpers import command, cli_env, wait_for_step

    ckpt = tmp_path / "ckpt"
    args = ["+experiment=convergence", "model=maptr", "seed=2023", "accel=none", "trainer.max_epochs=3",
            "bench.warmup_steps=2", "model.batch_size=2", "model.val_batch_size=2", "ckpt=local", f"ckpt.dir={ckpt}",
            "ckpt.every_n_steps=5"]  # the mini set: 5 steps per epoch
    first = subprocess.Popen(command([*args, f"hydra.run.dir={tmp_path / 'first'}"]), cwd=tmp_path,
                             env=cli_env(drivebench_cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(ckpt, 5, first)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    assert first.returncode == 143
    second = run_cli([*args, "resume=auto", f"hydra.run.dir={tmp_path / 'second'}"], drivebench_cache, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    segments = [_val_loss(tmp_path / name) for name in ("first", "second")]
    before = len(segments[0])  # 1 (the stop lands in epoch 2), or 2 on a machine slow to deliver the signal
    assert before >= 1 and before + len(segments[1]) == 3 and segments[1]["step"].tolist()[-1] == 15 - 1
    worst = float(pd.concat(segments)["value"].max())
    out = tmp_path / "report"
    assert main([str(tmp_path / "first"), str(tmp_path / "second"), f"report.out={out}",
                 f"--target=val/loss<={worst!r}"]) == 0
    convergence = pd.read_csv(out / "convergence.csv")
    row = convergence[convergence["target"] == f"val/loss<={worst!r}"].iloc[0]
    assert (row["runs"], row["finals"], row["resumed"], row["reached"]) == (1, 1, 1, "1/1")
    runset = load_runs([tmp_path / "first", tmp_path / "second"])
    followed = followed_runs(runset.runs, runset.stopped, runset.scalars, [])
    curve = validation_curve(followed.scalars, str(tmp_path / "second"), "val/loss")
    assert curve["step"].tolist() == [4, 9, 14] and curve["elapsed_s"].is_monotonic_increasing
    first_span = runset.scalars[runset.scalars["run_dir"] == str(tmp_path / "first")]["elapsed_s"].max()
    own = validation_curve(runset.scalars, str(tmp_path / "second"), "val/loss")  # the second process's own clock
    assert curve["elapsed_s"].iloc[before:].tolist() == pytest.approx((own["elapsed_s"] + first_span).tolist())
    assert "1 resumed" in capsys.readouterr().out


def test_bad_target_and_val_batches_are_refused_before_the_run_is_built(drivebench_cache):
    from drivebench.bench.runners import TrainBench
    from drivebench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"bench.targets='val/minFDE=2' is not valid"):
        TrainBench(targets=["val/minFDE=2"])
    with pytest.raises(ConfigError, match=r"bench.val_batches=-1 is not valid"):
        TrainBench(val_batches=-1)
    assert TrainBench(val_batches="all").val_batches == 1.0
    assert TrainBench(targets="val/mAP >= 0.5").targets == ["val/mAP>=0.5"]
    result = run_cli(["model=maptr", "ckpt=none", "bench.targets=['val/minFDE=2']"], drivebench_cache, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[-1].startswith("drivebench: error: bench.targets='val/minFDE=2' is not valid")



def test_a_convergence_job_killed_without_its_final_summary_still_reports_its_curve(tmp_path, drivebench_cache, capsys):
    """SIGKILL after the second epoch's validation (what a scheduler does when its grace runs out): the summary
    written when training started says running; the report lists the run as died, exit 0, and its
    convergence table follows the validation it logged."""
    import time

    from drivebench.report.cli import main
    from drivebench.report.events import read_scalars
    from test_ckpt_cli_helpers import command, cli_env

    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(command(["+experiment=convergence", "model=maptr", "seed=2023", "accel=none",
                                     "trainer.max_epochs=4", "bench.warmup_steps=2", "model.batch_size=2",
                                     "model.val_batch_size=2", f"hydra.run.dir={run_dir}"]),
                            cwd=tmp_path, env=cli_env(drivebench_cache), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    frame = pd.DataFrame(columns=["tag"])
    while (frame["tag"] == "val/loss").sum() < 2:  # two epochs' validations are on disk
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "not two validations within 300 s"
        time.sleep(0.5)
        frame, _ = read_scalars(sorted((run_dir / "tb").glob("events.out.tfevents.*")))
    proc.kill()
    proc.communicate(timeout=60)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run"]["status"] == "running" and summary["machine"]["cpu_cores"] and summary["run"]["run_id"]
    assert summary["run"]["schedule_steps"] == 4 * 5  # four epochs of the mini set's 5 batches of 2
    threshold = float(frame.loc[frame["tag"] == "val/loss", "value"].iloc[0])
    out = tmp_path / "report"
    assert main([str(run_dir), f"report.out={out}", f"--target=val/loss<={threshold!r}"]) == 0
    text = capsys.readouterr().out
    convergence = pd.read_csv(out / "convergence.csv")
    row = convergence[convergence["target"] == f"val/loss<={threshold!r}"].iloc[0]
    assert (row["setting"], row["runs"], row["finals"], row["reached"]) == ("none", 1, 0, "1/1")
    assert "| died |" in (out / "report.md").read_text() and "still says running" in text
