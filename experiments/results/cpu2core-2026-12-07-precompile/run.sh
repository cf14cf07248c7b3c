#!/usr/bin/env bash
# usage: run.sh NAME PRECOMPILE(0/1)
cd /work/main
export TORCHINDUCTOR_CACHE_DIR=/tmp/pc/cache-$1 TORCH_CACHING_PRECOMPILE=$2
/usr/bin/time -f "%e s wall" .venv/bin/python -m drivebench model=qcnet model.size=test accel.compile=true bench.steps=6 ckpt=none bench.ceiling=false bench.val_batches=0 hydra.run.dir=/tmp/pc/$1-$3 > /tmp/pc/$1-$3.log 2>&1
.venv/bin/python - /tmp/pc/$1-$3/summary.json <<'PY'
import json,sys
s=json.load(open(sys.argv[1])); c=s['settings'].get('compile_report') or {}
cs=c.get('compile_s') or {}
print(sys.argv[1], 'graphs',c.get('graphs'),'total',cs.get('total'),'phases',cs.get('phases'), 'fx', {k:v for k,v in c.items() if 'cache' in k})
PY
