#!/usr/bin/env bash
# GPU smoke test: every model at its CPU-test size, accel=max (compile, bf16, device transforms),
# a few steps each. Logs and summaries go to $OUT/smoke.tar.gz.
source scripts/device/setup.sh || exit 1
mkdir -p /tmp/smoke
run() {
  local name=$1; shift
  echo "=== $name: $*"
  timeout 240 python3 -m drivebench "$@" data.size=mini accel=max trainer.max_steps=14 bench.warmup_steps=6 \
    bench.val_batches=2 bench.ceiling_steps=6 bench.ceiling_warmup_steps=3 ckpt=async ckpt.every_n_steps=5 \
    hydra.run.dir=/tmp/smoke/$name > /tmp/smoke/$name.log 2>&1
  echo "rc=$?"; grep -E "throughput|efficiency|Error|error" /tmp/smoke/$name.log | head -8
}
run qcnet model=qcnet model.size=tiny
run maptr model=maptr model.size=test model.batch_size=2
run sparsedrive model=sparsedrive model.size=test model.batch_size=1 model.val_batch_size=1
run gaussianformer model=gaussianformer model.size=test
tar czf $OUT/smoke.tar.gz -C /tmp smoke
