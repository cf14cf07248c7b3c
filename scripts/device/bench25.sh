#!/usr/bin/env bash
# GPU benchmark, part 25 (not yet run; one H200): issue 19's open question. The deformable aggregation
# compiled by Inductor is 1.5x (SparseDrive map head) and 2.6x (GaussianFormer) faster than grid_sample
# alone (results/h200-2026-12-02-b24); does the whole accel=max step gain? Each model at max with the
# default grid_sample and with compiled, interleaved (default, compiled, default) so drift shows.
#   bash scripts/device/bench25.sh > /dev/null 2>&1; tail -c 8000 $OUT/log.txt     (~9 min)
export LIMIT=${LIMIT:-585}; source scripts/device/lib.sh || exit 1
source scripts/device/bench17_lib.sh
export DRIVEBENCH_EXIT_TIMEOUT_S=20 CUDA_VISIBLE_DEVICES=0
G="model=gaussianformer model.size=gs25600 $STEPS accel=max"
S="model=sparsedrive model.size=small $STEPS accel=max"
runs gf_max_grid 200 $G                                   # first run: data generation included
runs gf_max_compiled 130 $G model.net.aggregation=compiled
runs sd_max_grid 170 $S                                   # data generation included
runs sd_max_compiled 150 $S model.net.aggregation=compiled
runs gf_max_grid_again 110 $G
log "done in $(( $(date +%s) - START ))s"
