"""The thread budget on a busy machine: ``make run``'s command timed with and without one CPU-bound
process beside it, in interleaved rounds (each round runs every variant idle, then busy), so that
whatever else the machine does falls on both alike. Figures are ratios within this one session.

    python scripts/bench_threads.py                      # make run's command (accel=max, threads=auto), 3 rounds
    python scripts/bench_threads.py --variants auto,default --short   # + PyTorch's default threads, short runs

``--short`` trims each run to its training phase (``bench.steps=6``, no ceiling, no validation):
PyTorch's defaults beside a busy process take tens of seconds per step on 2 cores (issue 24), so whole
runs of them do not fit a session. Per run it prints the wall time, the median step time with p10-p90
and the run queue the system monitor saw; then per variant the busy / idle ratios of the medians over
rounds, with their range over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND = ["-m", "drivebench", "model=qcnet", "accel=max"]  # the Makefile's `make run`
SHORT = ["bench.warmup_steps=2", "bench.steps=6", "bench.ceiling=false", "bench.val_batches=0"]
SPIN = "while True: pass"


def run_once(variant: str, busy: bool, out: Path, short: bool, extra: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}  # PyTorch's own defaults
    env["PYTHONPATH"] = str(REPO)
    run_dir = out / f"{variant}-{'busy' if busy else 'idle'}-{time.strftime('%H%M%S')}"
    args = [sys.executable, *COMMAND, f"accel.threads={variant}", f"hydra.run.dir={run_dir}",
            *(SHORT if short else []), *extra]
    spinner = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
    try:
        time.sleep(0.5 if busy else 0)
        started = time.perf_counter()
        done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}): {' '.join(args)}\n{done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    train = summary["train"]
    system = train.get("system") or {}
    return {"variant": variant, "busy": busy, "wall_s": wall, "step_median": train["step_s"]["median"],
            "step_p10": train["step_s"]["p10"], "step_p90": train["step_s"]["p90"],
            "run_queue": (system.get("run_queue") or {}).get("median"),
            # CPU the training process got per step: with the cores shared fairly and nothing spinning,
            # the same busy or idle; the wall time then grows only by the share the other process takes
            "cpu_per_step": ((system.get("cpu_main_pct") or {}).get("median") or 0.0) / 100 * train["step_s"]["median"],
            "threads": (summary["settings"].get("threads") or {}).get("note"),
            "verdict": summary["bottleneck"]["verdict"]}


def ratio_line(rows: list[dict], key: str) -> str:
    idle = [r[key] for r in rows if not r["busy"]]
    busy = [r[key] for r in rows if r["busy"]]
    per_round = [b / i for i, b in zip(idle, busy)]
    return (f"{key}: idle median {statistics.median(idle):.3g} s, busy median {statistics.median(busy):.3g} s, "
            f"busy/idle {statistics.median(busy) / statistics.median(idle):.2f}x "
            f"(per round {min(per_round):.2f}-{max(per_round):.2f}x over {len(per_round)} rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="auto", help="accel.threads values, comma separated")
    parser.add_argument("--short", action="store_true", help="training phase only, 6 measured steps")
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temporary one)")
    parser.add_argument("extra", nargs="*", help="more overrides for every run")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-threads-"))
    variants = args.variants.split(",")
    print(f"machine: {len(os.sched_getaffinity(0))} usable CPUs, load {os.getloadavg()[0]:.1f} at start; "
          f"runs in {out}", flush=True)
    rows = []
    for rnd in range(args.rounds):
        for variant in variants:
            for busy in (False, True):
                row = run_once(variant, busy, out, args.short, args.extra)
                rows.append(row)
                print(f"round {rnd} threads={variant:<7} {'busy' if row['busy'] else 'idle'}: wall {row['wall_s']:.1f} s, "
                      f"step {row['step_median']:.3g} s [{row['step_p10']:.3g}, {row['step_p90']:.3g}], "
                      f"training process CPU {row['cpu_per_step']:.3g} s per step, run queue {row['run_queue']}, "
                      f"verdict {row['verdict']}; {row['threads']}", flush=True)
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        print(f"threads={variant}: {ratio_line(mine, 'wall_s')}")
        print(f"threads={variant}: {ratio_line(mine, 'step_median')}")
        print(f"threads={variant}: {ratio_line(mine, 'cpu_per_step')}")


if __name__ == "__main__":
    main()
