"""QCNet's compiled layers on padded batches, cold and warm: how much compiling each start costs, with
``accel.compile_dynamic`` null (dynamo decides: static first, dynamic after a recompile) or true.

For each setting, two processes share one empty Inductor cache: the first (seed 2024) compiles it cold,
the second (seed 2025: other batches, so other bucket shapes) starts warm. Each trains ``--steps`` steps
of the forward, loss and backward (no optimizer; compile is what is measured) on the padded batches
that ``accel.cuda_graphs`` would capture, and prints the compile report: graphs, seconds compiling, and
the FX-graph cache's hits and misses. Figures are ratios within one session on this machine (the CPU
backend compiles C++ where a GPU compiles Triton; the graphs, and so the cache's hits, are the same).

    python scripts/bench_compile_cache.py                    # both settings, 40 steps
    python scripts/bench_compile_cache.py --dynamic true     # one setting
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
SLOW_STEP_S = 2.0  # a step this slow compiled something


def one_process(dynamic: str, steps: int, seed: int) -> None:
    from drivebench.accel.compile import compile_report
    from drivebench.app import build_run
    from drivebench.compose import compose

    out = Path(tempfile.mkdtemp(prefix="compile-cache-"))
    cfg = compose(["model=qcnet", "ckpt=none", "accel=none", "accel.compile=true", f"accel.compile_dynamic={dynamic}",
                   "accel.compile_cache=torch", "accel.num_workers=0", f"seed={seed}", f"paths.output_dir={out}"])
    run = build_run(cfg, out, progress=False)
    run.datamodule.prepare_data()
    run.datamodule.setup("fit")
    loader = run.datamodule.train_dataloader()
    batches = iter(loader)
    times = []
    for _ in range(steps):
        try:
            batch = next(batches)
        except StopIteration:  # the CPU's mini set is a few batches long: next epoch
            batches = iter(loader)
            batch = next(batches)
        started = time.perf_counter()
        losses = run.module.loss_of_batch(run.module.static_batch(batch))
        losses["loss"].backward()
        times.append(time.perf_counter() - started)
    report = compile_report()
    print(json.dumps({"graphs": report.get("graphs"), "compile_s": report.get("compile_s"),
                      "fx_graph_cache": report.get("fx_graph_cache"),
                      "buckets": run.module.static_shapes_report().get("padding", {}).get("buckets"),
                      "slow_steps_s": [round(t, 1) for t in times if t > SLOW_STEP_S],
                      "median_step_s": statistics.median(times)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dynamic", choices=["null", "true", "both"], default="both")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--one", nargs=2, metavar=("DYNAMIC", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_process(args.one[0], args.steps, int(args.one[1]))
        return
    for dynamic in (["null", "true"] if args.dynamic == "both" else [args.dynamic]):
        cache = tempfile.mkdtemp(prefix="inductor-")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for start, seed in (("cold", 2024), ("warm", 2025)):
            done = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--one", dynamic, str(seed)],
                                  env=env, capture_output=True, text=True, cwd=REPO)
            if done.returncode != 0:
                sys.exit(f"compile_dynamic={dynamic} {start}: failed\n{done.stderr[-3000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"compile_dynamic={dynamic:4s} {start}: graphs {r['graphs']}, compiling {r['compile_s']['total']:.1f} s "
                  f"(Inductor {r['compile_s']['inductor']:.1f}), FX cache hits/misses {r['fx_graph_cache']['hits']}/"
                  f"{r['fx_graph_cache']['misses']}, buckets {r['buckets']}, slow steps {r['slow_steps_s']}, "
                  f"median step {r['median_step_s']:.3f} s", flush=True)


if __name__ == "__main__":
    main()
