#!/usr/bin/env bash
# Helpers for benchmark scripts on the GPU machine: a time budget, one log streamed to $OUT as
# each run finishes, and a cumulative tarball of run directories (summaries + TensorBoard).
# LIMIT counts from here, the wheels' install included, and a run's cap leaves its SIGKILL grace inside it: the
# `run` tool's timeout then needs LIMIT plus the closing report only (~30 s); b50's calls, LIMIT 575 and 330 with
# timeouts 600 and 360, ran past both (setup before START, caps ending at LIMIT - 15 plus a 20-s grace)
START=$(date +%s)
source scripts/device/setup.sh || exit 1
LIMIT=${LIMIT:-560}
RUNS=/tmp/runs
rm -rf "$RUNS"  # a machine kept warm between calls still holds the previous call's runs
mkdir -p "$RUNS" "$OUT"
log() { echo "$@" | tee -a "$OUT/log.txt"; }
bundle() {
  (cd "$RUNS" && tar czf "$OUT/.runs.tgz" --exclude='*.ckpt' --exclude='*.partial' . 2>/dev/null) && mv "$OUT/.runs.tgz" "$OUT/runs.tgz"
}
# revision: the checkout's commit, "+changes" when the copied working tree differs from it (the device's
# copy of .git can lag the working tree it was sent with)
revision() { echo "$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- drivebench scripts 2>/dev/null || echo '+changes')"; }
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
# [PIN=<cpu list>] run NAME CAP_SECONDS drivebench overrides...  (PIN: taskset the run onto those
# cores; KILL_GRACE: seconds between the cap's SIGTERM, which stops at a step boundary and writes the summary, and SIGKILL)
run() {
  local name=$1 cap=$2; shift 2
  local remaining; remaining=$(left)
  if (( remaining < 40 )); then log "SKIP $name (budget)"; return; fi
  local room=$(( remaining - 15 - ${KILL_GRACE:-5} ))
  (( cap > room )) && cap=$room
  log "=== $name (cap ${cap}s, $(left)s left): $*"
  local t0; t0=$(date +%s)
  if [[ -n ${PIN:-} ]] && ! command -v taskset > /dev/null; then log "no taskset here: $name runs unpinned"; local PIN=; fi
  ${PIN:+taskset -c $PIN} timeout -k "${KILL_GRACE:-5}" "$cap" python3 -m drivebench "$@" hydra.run.dir="$RUNS/$name" > "$RUNS/$name.log" 2>&1
  local rc=$?
  log "rc=$rc in $(( $(date +%s) - t0 ))s"
  grep -E "^(throughput|step time|data wait|device busy|GPU util|ceiling|efficiency|peak|compiling|train loss|validation|  validation split|val (loss|minADE|minFDE|cv_minFDE|cv_minADE|MR|mAP|mIoU|iou) )" "$RUNS/$name.log" | tee -a "$OUT/log.txt"
  if (( rc != 0 )); then grep -E "Error|error|Traceback" "$RUNS/$name.log" | tail -6 | tee -a "$OUT/log.txt"; tail -c 4000 "$RUNS/$name.log" | tr '\r' '\n' | grep -v "train step:" | tail -3 >> "$OUT/log.txt"; fi
  bundle
}
# facts RUN: QCNet's padding, CUDA graphs, compile figures and the verdict from the run's summary
facts() {
  python3 - "$RUNS/$1/summary.json" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import json, sys
s = json.load(open(sys.argv[1]))
st = s.get("settings", {})
cg = st.get("cuda_graphs") or {}
pad = (cg.get("padding") if isinstance(cg, dict) else None) or {}
print("  padding:", {k: pad.get(k) for k in ("buckets", "growth", "max_buckets", "padded_over_real_rows")},
      "graphs:", {k: cg.get(k) for k in ("graphs", "capture_s")} if isinstance(cg, dict) else cg)
val = cg.get("validation") if isinstance(cg, dict) else None
if val:
    print("  validation graphs:", {k: val.get(k) for k in ("graphs", "capture_s", "replays")},
          "padded:", (val.get("padding") or {}).get("padded_over_real_rows"))
print("  compile:", st.get("compile_report") or s.get("compile"), "| bottleneck:", (s.get("bottleneck") or {}).get("verdict"))
PY
}
# curve RUN METRIC...: the validation metric after each epoch (step:value@seconds since training began), also
# for a run stopped by its cap (load_runs keeps it in RunSet.stopped with its events up to the stop)
curve() {
  python3 - "$RUNS/$1" "${@:2}" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import sys
from drivebench.report import load_runs
from drivebench.report.convergence import validation_curve
found = load_runs([sys.argv[1]])
rows = found.runs if not found.runs.empty else found.stopped
if rows.empty:
    sys.exit(f"no completed or stopped run in {sys.argv[1]}")
status = "completed" if not found.runs.empty else "interrupted"
for metric in sys.argv[2:]:
    c = validation_curve(found.scalars, str(rows["run_dir"].iloc[0]), metric)
    print(f"  {metric} ({status}): " + " ".join(f"{int(s)}:{v:.4g}@{t:.0f}s" for s, v, t in zip(c["step"], c["value"], c["elapsed_s"])))
PY
}
# trials RUN: the accel trial's table and its cost from the run's summary
trials() {
  python3 - "$RUNS/$1/summary.json" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import json, sys
from drivebench.bench.autotune import render_trials
a = json.load(open(sys.argv[1]))["autotune"]
print(render_trials(a)); print("  cost_s", a.get("cost_s"), "fraction", a.get("cost_fraction_of_run"))
print("  compile in run:", a.get("compile_in_run"), "| trained with:", a.get("chosen"))
print("  on the run's steps:", a.get("in_run_trial"), "| restarted:", a.get("retuned"))
for t in a["trials"]:
    if t.get("cost_split"):
        print(f"  split {t['change'][:28]:28s}", " ".join(f"{k}={v:.2f}" for k, v in t["cost_split"].items()),
              "| warm-up [step, wait]:", " ".join(f"{a:.2f}/{b:.2f}" for a, b in t.get("warmup_steps_s") or []))
PY
}
# report: this call's runs, reported with their recorded targets (the convergence table into the log)
report() {
  (( $(left) > 30 )) && timeout 60 python3 -m drivebench.report "$RUNS" --out "$OUT/report" > "$OUT/report.txt" 2>&1
  grep -A12 "^convergence:" "$OUT/report.txt" | tee -a "$OUT/log.txt"
}
# cold TAG: an empty Inductor cache of its own for what follows (the run pays a first compile, as a user's first run does)
reuse_cache() { export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$1; }  # NAME's Inductor cache, as an earlier call left it
cold() { reuse_cache "$1"; rm -rf "$TORCHINDUCTOR_CACHE_DIR"; }
# one_gpu_part PART: how a single-GPU benchN.sh part starts (PART set, the commit logged)
one_gpu_part() {
  export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0 KILL_GRACE=${KILL_GRACE:-20}
  PART=${1:-a}
  log "commit $(revision), part $PART"
}
# resumable NAME EVERY "METRICS" OVERRIDES...: a run (cap 575 s) that checkpoints every EVERY steps outside the run
# folder (ckpt=local or ckpt=async among OVERRIDES), so that a run cut by its cap is continued by the same part again
# on the machine kept warm (resume=auto; the report joins the two processes on one clock): the none runs estimated
# close to a call's cap (bench39's g, i, m, n, q; bench48's a, b)
resumable() {
  local name=$1 every=$2 metrics=$3; shift 3
  run "$name" 575 "$@" ckpt.dir="/tmp/ckpt-$name" ckpt.every_n_steps="$every" resume=auto
  curve "$name" $metrics
}
# conv_max MODEL METRICS...: MODEL's convergence run at max, one per seed (SEEDS, default "2023 2024"; CAP s each,
# default 270) on an emptied Inductor cache of its own (WARM=1: on the cache an earlier call left); RECIPE: extra
# overrides (GaussianFormer's learning rate, a knob under test)
conv_max() {
  if [[ -n ${WARM:-} ]]; then reuse_cache "$1-conv"; else cold "$1-conv"; fi
  for s in ${SEEDS:-2023 2024}; do run "$1_conv_max_s$s" "${CAP:-270}" +experiment=convergence model="$1" ${RECIPE:-} accel=max seed=$s; curve "$1_conv_max_s$s" "${@:2}"; done
}
# what parts share: QCNet's convergence experiment and its metrics, a bounded run that only trains
QCNET_CONV="+experiment=convergence model=qcnet"
QCNET_METRICS="val/minFDE val/cv_minFDE"
SDM="val/map/mAP val/det/mAP val/plan/L2_avg val/plan/cv_L2_avg"  # SparseDrive's convergence metrics (bench39, bench60)
TRAIN_ONLY="ckpt=none bench.ceiling=false bench.val_batches=0"
# qcnet_warm TAG "SEEDS" OVERRIDES...: QCNet convergence max on a warm cache: a training-only max run fills an empty
# cache (as b37's a3 did; TF32 and the other settings are in Inductor's key, so OVERRIDES go to all), a one-epoch
# run fills the shape profile's graphs (2026-12-07), then one convergence run per seed on it (bench39 c: TF32 off; t: as configured, on an H100; bench50: fp32)
qcnet_warm() {
  local tag=$1 seeds=$2; shift 2
  # FILL_CAP: a cold QCNet compile fits 240 s on an H200 (b37) but not on an H100 (b50: cut, so the seeds compiled)
  cold "qcnet$tag"; run "qcnet_fill$tag" "${FILL_CAP:-240}" model=qcnet $TRAIN_ONLY accel=max bench.steps=30 "$@"
  # the run after a cold one compiles the shape profile's graphs (b52: the first seed after one fill compiled 39 s,
  # the next 12.4-12.8 s; results/cpu2core-2026-12-07-sparsedrive-cache): one epoch under the profile, validation
  # included, fills them before the timed seeds
  run "qcnet_fill2$tag" "${FILL2_CAP:-100}" $QCNET_CONV accel=max seed=2023 "$@" trainer.max_epochs=1
  qcnet_seeds "$tag" "$seeds" "${CAP:-160}" "$@"
}
# qcnet_seeds TAG "SEEDS" CAP OVERRIDES...: one QCNet convergence max run per seed on the cache in use
qcnet_seeds() {
  local tag=$1 seeds=$2 cap=$3; shift 3
  for s in $seeds; do
    local name="qcnet_conv_max${tag}_s${s}_warm"
    run "$name" "$cap" $QCNET_CONV accel=max seed=$s "$@"; curve "$name" $QCNET_METRICS; facts "$name"
  done
}
# MapTR nano with the recipe that learnt the bench set on the CPU (results/cpu2core-2026-12-05-backbone-bn)
NANO="+experiment=convergence model=maptr model.size=nano model.optimizer.lr=2e-3 model.module.backbone_lr_mult=1.0"
# auto_then_max NAME OVERRIDES...: accel=auto (numerics allowed) then max, training only, on one empty Inductor cache
auto_then_max() {
  local name=$1; shift
  cold "$name"; run "${name}_auto" 320 "$@" $TRAIN_ONLY accel=auto accel.auto_numerics=true; trials "${name}_auto"
  run "${name}_max" 240 "$@" $TRAIN_ONLY accel=max
}
