#!/bin/bash
# two seeds on one Inductor cache, MapTR test size on the CPU, WITHOUT the shape profile (what
# accel.compile_shape_profile=auto now does for SparseDrive without denoising): does the second find the first's graphs?
cd /work/main
rm -rf /tmp/mtcache-off
for seed in 2023 2024; do
  .venv/bin/python -m drivebench model=maptr accel=none accel.compile=true accel.compile_shape_profile=false \
    accel.compile_cache=/tmp/mtcache-off seed=$seed bench.warmup_steps=2 bench.steps=6 \
    bench.ceiling=false bench.val_batches=0 ckpt=none hydra.run.dir=/tmp/mtc-off-$seed > /tmp/mtc-off-$seed.log 2>&1
  .venv/bin/python -c "
import json; s=json.load(open('/tmp/mtc-off-$seed/summary.json')); c=s['settings']['compile_report']
print('seed=$seed', s['run']['status'], 'shape_profile', s['settings'].get('shape_profile'), 'fx', c.get('fx_graph_cache'), 'aot', c.get('aot_autograd_cache'), 'compile_s', c['compile_s']['total'], 'graphs', c['graphs'], 'step', round(s['train']['step_s']['median'],3))"
done
