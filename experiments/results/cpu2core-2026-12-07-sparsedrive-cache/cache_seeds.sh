#!/bin/bash
# two seeds on one Inductor cache, SparseDrive test size on the CPU: does the second find the first's graphs?
cd /work/main
for dyn in null true; do
  rm -rf /tmp/sdcache-$dyn
  for seed in 2023 2024; do
    .venv/bin/python -m drivebench model=sparsedrive accel=none accel.compile=true accel.compile_shape_profile=true \
      accel.compile_dynamic=$dyn accel.compile_cache=/tmp/sdcache-$dyn seed=$seed bench.warmup_steps=2 bench.steps=6 \
      bench.ceiling=false bench.val_batches=0 ckpt=none hydra.run.dir=/tmp/sdc-$dyn-$seed > /tmp/sdc-$dyn-$seed.log 2>&1
    .venv/bin/python -c "
import json; s=json.load(open('/tmp/sdc-$dyn-$seed/summary.json')); c=s['settings']['compile_report']
print('dyn=$dyn seed=$seed', s['run']['status'], 'fx', c.get('fx_graph_cache'), 'aot', c.get('aot_autograd_cache'), 'compile_s', c['compile_s']['total'], 'graphs', c['graphs'], 'step', round(s['train']['step_s']['median'],3))"
  done
done
