"""accel=auto's trial with and without handing the loader workers from one candidate to the next.

Each mode runs in its own process, which holds ``--ballast-gb`` of touched memory (a GPU training
process holds gigabytes: forking loader workers beside it copies its page tables, and its first
writes afterwards copy pages). It times ``--candidates`` trial candidates of one setting (QCNet at
test size, 2 loader workers): with reuse, every candidate after the first takes over the previous
one's running workers; without, each starts its own. Per mode it prints each candidate's cost, its
first warm-up step and the median over the later candidates. Figures are ratios within one session.

    python scripts/bench_trial_reuse.py                      # both modes, 6 GB ballast, 4 candidates
    python scripts/bench_trial_reuse.py --ballast-gb 0       # a small process: little to save
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_mode(reuse: bool, ballast_gb: float, candidates: int, workers: int) -> None:
    import torch
    from hydra import compose, initialize_config_dir

    from drivebench.app import build_run
    from drivebench.bench import autotune

    ballast = torch.ones(int(ballast_gb * 2**30 / 4)) if ballast_gb else None  # noqa: F841 (held)
    out = Path(tempfile.mkdtemp(prefix="trial-reuse-"))
    with initialize_config_dir(config_dir=str(REPO / "drivebench" / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=qcnet", "accel=auto", "ckpt=none", f"paths.output_dir={out}",
            f"accel.num_workers={workers}", "accel.persistent_workers=true"])
    # fresh: every candidate starts its own workers, as before the hand-over
    trial = autotune.AccelTrial(cfg, out, build_run, report=lambda text: None, share_loaders=reuse)
    costs, firsts = [], []
    for i in range(candidates):
        m = trial.measure({"num_workers": workers}, 1000.0)
        if m.error:
            sys.exit(f"candidate {i} failed: {m.error}")
        costs.append(m.cost_s)
        firsts.append(m.warmup_steps_s[0][0])
        print(f"  {'reuse' if reuse else 'fresh'} candidate {i}: cost {m.cost_s:.2f} s, first step {firsts[-1]:.2f} s, "
              f"median step {m.median:.3f} s, split {m.cost_split}", flush=True)
    trial.close()
    later = costs[1:]
    print(f"{'reuse' if reuse else 'fresh'}: later candidates' cost median {statistics.median(later):.2f} s "
          f"[{min(later):.2f}-{max(later):.2f}], first step median {statistics.median(firsts[1:]):.2f} s, "
          f"workers handed over {trial.loader_reused} times", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ballast-gb", type=float, default=6.0)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", choices=("both", "reuse", "fresh"), default="both")
    args = parser.parse_args()
    if args.mode != "both":
        one_mode(args.mode == "reuse", args.ballast_gb, args.candidates, args.workers)
        return
    for mode in ("fresh", "reuse"):  # each in a process of its own: no state carried between them
        subprocess.run([sys.executable, __file__, "--mode", mode, "--ballast-gb", str(args.ballast_gb),
                        "--candidates", str(args.candidates), "--workers", str(args.workers)], check=True, cwd=REPO)


if __name__ == "__main__":
    main()
