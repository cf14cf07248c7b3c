#!/usr/bin/env bash
# GPU benchmark, part 56 (2026-12-07, twenty-seventh session), issue 20: GaussianFormer's first time to quality, and
# MapTR nano on an H200 where one comes. Too little device time is left after failed starts for bench55 (QCNet,
# 15 epochs: ~1,400 s on an H200), so this session spends it on the models that fit. One call per part, each a
# sequence of earlier parts (their scripts reset the runs folder, so each one's runs.tgz is kept under its own name):
#   bash scripts/device/bench56.sh a > /dev/null 2>&1; tr '\r' '\n' < $OUT/log.txt | grep -v "train step:\|it/s\]" | tail -c 9000
# (run tool timeout 595; no QCNet, so av2's wheel stays out of .whl/)
#   a  on an H200: MapTR nano `max` seeds 2023 (cold), 2024, 2025 (bench49 d; the H200's `none` runs of b39/b42
#      validated on the map metric before e84ab2d: m pairs them with a `none` run of its own), then GaussianFormer `max` seed 2023 on an emptied cache (bench39 j); on an H100: GaussianFormer `max`
#      seeds 2023 (cold) and 2024 (warm) (bench39 j)
#   b  GaussianFormer `none` seed 2023, two epochs, checkpointed each half epoch (bench39 i: run again to continue;
#      LIMIT, default 565: what the session has left; SEED, default 2023: another seed)
#   c  GaussianFormer `max`, more seeds on a's cache (WARM=1; SEEDS, default 2025 on an H100, "2024 2025" on an H200)
#   m  MapTR nano on one machine and one map metric (since e84ab2d the metric scores only pairs within 1.5 m: the same
#      flags, validations ~1.4 s shorter untrained on the CPU, so `none` runs validated before it are not comparable):
#      `max` seeds 2023 (cold), 2024, 2025 (bench49 d, ~230 s), then `none` seed 2024 checkpointed each epoch to the
#      call's end (bench49 b)
#   n  that `none` run continued on the machine kept warm (bench49 b; LIMIT, default 565); the report on the CPU
#      over m's and n's runs joins its processes on one clock
set -u
part=${1:-a}
keep() { [[ -f $OUT/runs.tgz ]] && mv "$OUT/runs.tgz" "$OUT/runs-$1.tgz"; [[ -f $OUT/report.txt ]] && mv "$OUT/report.txt" "$OUT/report-$1.txt"; rm -rf "$OUT/report"; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
mkdir -p "$OUT"; echo "=== bench56 part $part on $gpu" >> "$OUT/log.txt"
case "$part:$gpu" in
  a:*H200*) LIMIT=265 bash scripts/device/bench49.sh d; keep maptr
            SEEDS=2023 CAP=300 LIMIT=300 bash scripts/device/bench39.sh j; keep gf ;;
  a:*)      SEEDS="2023 2024" CAP=330 LIMIT=560 bash scripts/device/bench39.sh j; keep gf ;;
  b:*)      LIMIT=${LIMIT:-565} bash scripts/device/bench39.sh i; keep gf-none ;;
  m:*)      LIMIT=265 bash scripts/device/bench49.sh d; keep maptr
            LIMIT=300 bash scripts/device/bench49.sh b; keep maptr-none ;;
  n:*)      LIMIT=${LIMIT:-565} bash scripts/device/bench49.sh b; keep maptr-none ;;
  c:*H200*) WARM=1 SEEDS=${SEEDS:-"2024 2025"} CAP=${CAP:-250} LIMIT=565 bash scripts/device/bench39.sh j; keep gf-warm ;;
  c:*)      WARM=1 SEEDS=${SEEDS:-2025} CAP=${CAP:-300} LIMIT=330 bash scripts/device/bench39.sh j; keep gf-warm ;;
  *) echo "unknown part $part (a, b, c, m, n)" | tee -a "$OUT/log.txt"; exit 2 ;;
esac
