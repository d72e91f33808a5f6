"""Issue 16 micro-benchmark: the linears of one 768-wide layer + an 8192-row lm_head, MKL (F.linear) vs oneDNN
prepacked, 1 and 2 threads, 1 and 16 rows (results: issue16_contention.txt). .venv/bin/python perf/report/issue16_linear_micro.py"""
import time

import torch
import torch.nn.functional as F

torch.manual_seed(0)
shapes=[(768,1280),(768,768),(768,6144),(3072,768),(768,8192)]
def bench(fn, n=30):
    for _ in range(3): fn()
    t=time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter()-t)/n*1e3
for threads in (1,2):
  torch.set_num_threads(threads)
  for M in (1,16):
    tot={"mkl":0,"onednn":0}
    for K,N in shapes:
        x=torch.randn(M,K); w=torch.randn(N,K)
        a=bench(lambda: F.linear(x,w))
        pw=torch.ops.mkldnn._reorder_linear_weight(w, M)
        b=bench(lambda: torch.ops.mkldnn._linear_pointwise(x,pw,None,"none",[],""))
        assert torch.allclose(F.linear(x,w), torch.ops.mkldnn._linear_pointwise(x,pw,None,"none",[],""), atol=1e-3, rtol=1e-4)
        tot["mkl"]+=a; tot["onednn"]+=b
    print(f"threads={threads} M={M} per-layer-set ms: mkl {tot['mkl']:.2f} onednn {tot['onednn']:.2f}", flush=True)
