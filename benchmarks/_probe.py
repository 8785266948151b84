import sys, time
sys.argv=["x"]
import causal
from common import median_seconds
L=int(sys.argv_len) if False else 2048
for name in ("ours_causal","ours_full","keras_mha_causal"):
    s=causal.layer_step_seconds(name, L, 3); print(name, round(s*1e3), "ms", flush=True)
for name,f in (("ours_kernel", causal.kernel_step(L)), ("torch_kernel", causal.torch_kernel_step(L))):
    print(name, round(median_seconds(f,3)*1e3), "ms", flush=True)
