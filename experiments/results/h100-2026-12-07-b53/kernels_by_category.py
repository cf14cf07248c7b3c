"""Kernel time per step of a torch.profiler trace, by category and by name (top 40): drivebench's own trace
analysis (every kernel in the profiled steps' window, per step), grouped by what the kernel's name says.

    python kernels_by_category.py <rank0.pt.trace.json.gz>   # call-p/runs.tgz: qcnet_max_profile/tb/profile/
"""
import gzip
import json
import re
import sys
from collections import defaultdict

from drivebench.perf.trace_analysis import analyse_trace

CATEGORIES = [('gemm', r'nvjet|gemm|cutlass|sm90_xmma|sm80_xmma|ampere|cublas'), ('triton_red', r'triton_(red|per)'),
              ('triton_poi', r'triton_poi'), ('triton_other', r'triton'),
              ('index_add/scatter', r'indexFunc|scatter|index_put'),
              ('gather/index_select', r'gather|index_select|indexSelect'), ('layernorm', r'layer_norm|LayerNorm|GammaBeta'),
              ('copy/cast', r'copy|Copy'), ('optimizer', r'multi_tensor|Fused.*Optim|adam'), ('gru/cudnn', r'GRU|RNN|cudnn'),
              ('reduce', r'reduce_kernel'), ('elementwise', r'elementwise'), ('memset/fill', r'[Ff]ill|memset')]


def category(name: str) -> str:
    return next((c for c, pattern in CATEGORIES if re.search(pattern, name)), 'other')


path = sys.argv[1]
trace = json.load(gzip.open(path) if path.endswith('gz') else open(path))
out = analyse_trace(trace, top_k=sys.maxsize)  # every kernel name, per step over the profiled steps
print('steps', out['steps'], 'gpu', json.dumps(out['gpu']))
ms, calls = defaultdict(float), defaultdict(float)
for row in out['top_kernels']:
    ms[category(row['name'])] += row['s_per_step'] * 1e3
    calls[category(row['name'])] += row['calls_per_step']
total = sum(ms.values())
for c, value in sorted(ms.items(), key=lambda kv: -kv[1]):
    print(f'{c:22s} {value:8.2f} ms/step {calls[c]:7.0f} kernels/step {value / total:6.1%}')
print(f'{"all":22s} {total:8.2f} ms/step')
for row in out['top_kernels'][:40]:
    print(f"{row['s_per_step'] * 1e3:7.2f} ms  {row['name'][:150]}")
