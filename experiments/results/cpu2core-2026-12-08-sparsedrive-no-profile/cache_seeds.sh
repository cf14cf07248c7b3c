#!/bin/bash
# runs in order on one emptied Inductor cache, test size on the CPU, WITHOUT the shape profile (what
# accel.compile_shape_profile=auto now does for SparseDrive without denoising, MapTR and GaussianFormer): does a later
# run find the first one's graphs?  usage: cache_seeds.sh [model (sparsedrive)] [seeds ("2023 2024 2025")]
model=${1:-sparsedrive}; seeds=${2:-"2023 2024 2025"}
cd /work/main
rm -rf /tmp/cache-off-$model
for seed in $seeds; do
  .venv/bin/python -m drivebench model=$model accel=none accel.compile=true accel.compile_shape_profile=false \
    accel.compile_cache=/tmp/cache-off-$model seed=$seed bench.warmup_steps=2 bench.steps=6 \
    bench.ceiling=false bench.val_batches=0 ckpt=none hydra.run.dir=/tmp/off-$model-$seed > /tmp/off-$model-$seed.log 2>&1
  .venv/bin/python -c "
import json; s=json.load(open('/tmp/off-$model-$seed/summary.json')); c=s['settings']['compile_report']
print('seed=$seed', s['run']['status'], 'shape_profile', s['settings'].get('shape_profile'), 'fx', c.get('fx_graph_cache'), 'aot', c.get('aot_autograd_cache'), 'compile_s', c['compile_s']['total'], 'graphs', c['graphs'], 'step', round(s['train']['step_s']['median'],3))"
done
