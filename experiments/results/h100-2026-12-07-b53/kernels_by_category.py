# usage: python kernels_by_category.py <rank0.pt.trace.json.gz> (from call-p/runs.tgz: qcnet_max_profile/tb/profile/)
"""Kernel time per step of a torch.profiler trace, by category and by name (top 40)."""
import gzip, json, re, sys
from collections import defaultdict
from drivebench.perf.trace_analysis import analyse_trace
t = json.load(gzip.open(sys.argv[1]) if sys.argv[1].endswith('gz') else open(sys.argv[1]))
out = analyse_trace(t, top_k=60)
n = out['steps']; print('steps', n, 'gpu', json.dumps(out['gpu']))
cats = [('gemm', r'nvjet|gemm|cutlass|sm90_xmma|sm80_xmma|ampere|cublas'), ('triton_red', r'triton_(red|per)'),
        ('triton_poi', r'triton_poi'), ('triton_other', r'triton'), ('index_add/scatter', r'indexFunc|scatter|index_put'),
        ('gather/index_select', r'gather|index_select|indexSelect'), ('layernorm', r'layer_norm|LayerNorm|GammaBeta'),
        ('copy/cast', r'copy|Copy'), ('optimizer', r'multi_tensor|Fused.*Optim|adam'), ('gru/cudnn', r'GRU|RNN|cudnn'),
        ('reduce', r'reduce_kernel'), ('elementwise', r'elementwise'), ('memset/fill', r'[Ff]ill|memset')]
evs = [e for e in t['traceEvents'] if e.get('ph') == 'X' and e.get('cat') == 'kernel']
steps = sorted((e for e in t['traceEvents'] if e.get('ph') == 'X' and str(e.get('name','')).startswith('ProfilerStep#') and e.get('cat') != 'gpu_user_annotation'), key=lambda e: e['ts'])
lo = steps[0]['ts']; hi = max(s['ts'] + s['dur'] for s in steps)
tot = defaultdict(float); cnt = defaultdict(int); names = defaultdict(float)
for e in evs:
    if not (lo <= e['ts'] < hi): continue
    name = e['name']
    for c, pat in cats:
        if re.search(pat, name): break
    else: c = 'other'
    tot[c] += e['dur']; cnt[c] += 1; names[name] += e['dur']
all_us = sum(tot.values())
for c, us in sorted(tot.items(), key=lambda kv: -kv[1]):
    print(f'{c:22s} {us/n/1e3:8.2f} ms/step {cnt[c]/n:7.0f} kernels/step {us/all_us:6.1%}')
print(f'{"all":22s} {all_us/n/1e3:8.2f} ms/step')
for name, us in sorted(names.items(), key=lambda kv: -kv[1])[:40]:
    print(f'{us/n/1e3:7.2f} ms  {name[:150]}')
