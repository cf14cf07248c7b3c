#!/usr/bin/env bash
# GPU benchmark, part 22 (issue 22, the largest lent kind: nvidia-h200-x8): +experiment=scaling for every
# model over 1, 2, 4 and 8 GPUs of one host with NCCL P2P on and off, and the doctor's all-reduce and
# P2P verdict on that host. Each job: accel=max, 10 warm-up + 50 measured steps, no validation, ceiling
# or checkpoints (drivebench/conf/experiment/scaling.yaml). One part per device call (each under ~9.5 min):
#   bash scripts/device/bench22.sh d > /dev/null 2>&1; tail -c 11000 $OUT/log.txt
#   d   the doctor on all GPUs: NCCL all-reduce between every pair, P2P on and off, its dist.p2p verdict
#       (doctor.json, which the report reads for the bus bandwidth), then the GPU test of a skipped job
#       (tests/test_scaling.py -m gpu: dist.devices = GPUs + 1 is skipped, the sweep goes on)  (~3-5 min)
#   q1  QCNet paper: 1 GPU (P2P on), 2 and 4 GPUs (on, off)                               (~5 jobs x 80 s)
#   q2  QCNet: 8 GPUs (on, off)
#   m1  MapTR tiny: 1 GPU (on), 2 and 4 GPUs (on, off)                                    (~5 jobs x 70 s)
#   m2  MapTR: 8 GPUs (on, off)
#   s1  SparseDrive small: 1 GPU (on), 2 GPUs (on, off)                                   (~3 jobs x 150 s)
#   s2  SparseDrive: 4 GPUs (on, off)
#   s3  SparseDrive: 8 GPUs (on, off)
#   g1, g2, g3  GaussianFormer gs25600: as s1, s2, s3                                     (~3 jobs x 130 s)
#   qg  QCNet at the paper's global batch of 32 (experiment.batch=global): 1, 2, 4, 8 GPUs, P2P on
# The job times are estimates from earlier single-GPU runs (bench8, bench20, bench21: start-up, data
# preparation and compile dominate a bounded run), not measurements of these sweeps; every sweep has a
# cap, and a sweep stopped at its cap keeps the summaries of the jobs it finished. At one GPU P2P has
# nothing to act on, so the parts run the 1-GPU job once (P2P on); the full sweep runs it for both
# settings. Order of priority: d, m1, m2, q1, q2, then s*, g*, qg. Then copy every part's runs.tgz side
# by side (experiments/results/h200x8-<date>-b22/<part>/) and report them together:
#   python -m drivebench.report experiments/results/h200x8-<date>-b22 --out experiments/results/h200x8-<date>-b22/report
# (report.md "Scaling over devices", scaling.png, scaling.csv; the doctor's record is matched to the runs
# of its host, else of a host with the same GPUs and driver, which the table names.)
export LIMIT=${LIMIT:-575}; source scripts/device/lib.sh || exit 1
export DRIVEBENCH_EXIT_TIMEOUT_S=20
unset CUDA_VISIBLE_DEVICES  # every GPU of the host: the 1-GPU job uses GPU 0
PART=${1:-d}
EXTRA=${BENCH22_EXTRA:-}  # more overrides for every sweep (a rehearsal on a CPU: model.size=test data.size=mini ...)
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
log "host $(hostname): $GPUS GPU(s); part $PART"
nvidia-smi topo -m 2>/dev/null | head -12 | tee -a "$OUT/log.txt"

# sweep NAME CAP_SECONDS overrides...: one Hydra multirun of +experiment=scaling into $RUNS/NAME
sweep() {
  local name=$1 cap=$2; shift 2
  local remaining; remaining=$(left)
  if (( remaining < 60 )); then log "SKIP $name (budget)"; return; fi
  (( cap > remaining - 20 )) && cap=$(( remaining - 20 ))
  log "=== $name (cap ${cap}s, $(left)s left): -m +experiment=scaling $*"
  local t0; t0=$(date +%s)
  timeout -k 10 "$cap" python3 -m drivebench -m +experiment=scaling "$@" $EXTRA hydra.sweep.dir="$RUNS/$name" \
    > "$RUNS/$name.log" 2>&1
  local rc=$?
  log "rc=$rc in $(( $(date +%s) - t0 ))s"
  grep -E "^(throughput|data wait|step time|peak)|skipped:" "$RUNS/$name.log" | tee -a "$OUT/log.txt"
  if (( rc != 0 )); then grep -E "Error|error|Traceback" "$RUNS/$name.log" | tail -6 | tee -a "$OUT/log.txt"; fi
  bundle
}
report() {  # this part's runs: the scaling table (the parts are reported together afterwards)
  (( $(left) > 30 )) || return
  timeout 60 python3 -m drivebench.report "$RUNS" --out "$OUT/report" > "$OUT/report.txt" 2>&1
  sed -n '/^scaling over devices:/,/^written:/p' "$OUT/report.txt" | cut -c1-260 | tee -a "$OUT/log.txt"
}
model() {  # PART -> the model of that part
  case "$1" in q*) echo qcnet ;; m*) echo maptr ;; s*) echo sparsedrive ;; g*) echo gaussianformer ;; esac
}

M=$(model "$PART")
case "$PART" in
  d) log "=== doctor on $GPUS GPUs"
     timeout -k 5 $(( $(left) - 200 )) python3 -m drivebench.doctor dist=ddp doctor.json="$RUNS/doctor/doctor.json" \
       > "$RUNS/doctor.txt" 2>&1
     log "rc=$?"; grep -E "gpu\.|versions\.nccl|versions\.driver|fix:" "$RUNS/doctor.txt" | cut -c1-600 | tee -a "$OUT/log.txt"
     python3 - "$RUNS/doctor/doctor.json" <<'EOF' 2>&1 | tee -a "$OUT/log.txt"
import sys
from pathlib import Path
from drivebench.report.scaling import read_doctor_record
r = read_doctor_record(Path(sys.argv[1]))
if r is None:
    sys.exit("the doctor recorded no all-reduce pairs")
for side in ("on", "off"):
    med, low = r.bandwidth(side)
    print(f"all-reduce bus bw, P2P {side}: median {med:.0f} GB/s, min {low:.0f} GB/s over {len(r.busbw[side])} pairs")
print(f"P2P verdict on {r.hostname}: dist.p2p={r.verdict}")
EOF
     bundle
     log "=== pytest -m gpu tests/test_scaling.py (a job asking for one GPU more than the host has is skipped)"
     timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=line tests/test_scaling.py > "$OUT/pytest_gpu.txt" 2>&1
     grep -E "passed|failed|FAILED|Error" "$OUT/pytest_gpu.txt" | tail -6 | tee -a "$OUT/log.txt" ;;
  q1|m1) sweep ${M}_1gpu 200 model=$M dist.devices=1 dist.p2p=on
         sweep ${M}_2_4gpu 380 model=$M dist.devices=2,4 dist.p2p=on,off ;;
  q2|m2|s3|g3) sweep ${M}_8gpu 540 model=$M dist.devices=8 dist.p2p=on,off ;;
  s1|g1) sweep ${M}_1gpu 220 model=$M dist.devices=1 dist.p2p=on
         sweep ${M}_2gpu 340 model=$M dist.devices=2 dist.p2p=on,off ;;
  s2|g2) sweep ${M}_4gpu 540 model=$M dist.devices=4 dist.p2p=on,off ;;
  qg) sweep qcnet_global32 540 model=qcnet experiment.batch=global dist.devices=1,2,4,8 dist.p2p=on ;;
  *) log "unknown part $PART (d, q1, q2, m1, m2, s1-s3, g1-g3, qg)"; exit 2 ;;
esac
report
log "part $PART done in $(( $(date +%s) - START ))s"
