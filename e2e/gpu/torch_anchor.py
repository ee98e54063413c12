"""torch_anchor.py [OUT.json]: the same models as export.py in PyTorch on the GPU (eager fp32 with
TF32 off, eager with TF32, torch.compile default and reduce-overhead, fp32 TF32 off), batch 1,
p50/p99 ms: the latency a user would get without kiln. OUT.json gets {model: {mode: [p50, p99]}}."""
import json, sys, time, torch, torchvision, statistics
from transformers import BertConfig, BertModel
torch.manual_seed(0)
dev = "cuda"
def bench(f, args, n=200):
    with torch.no_grad():
        for _ in range(20): f(*args)
        torch.cuda.synchronize(); ts = []
        for _ in range(n):
            t = time.perf_counter(); f(*args); torch.cuda.synchronize(); ts.append((time.perf_counter() - t) * 1e3)
    ts.sort(); return ts[len(ts) // 2], ts[int(len(ts) * 0.99) - 1]
models, results = {}, {}
m = torchvision.models.resnet50(weights=None).eval().to(dev); models["resnet50"] = (m, (torch.randn(1, 3, 224, 224, device=dev),))
cfg = BertConfig(); cfg._attn_implementation = "eager"
b = BertModel(cfg, add_pooling_layer=False).eval().to(dev)
ids = torch.randint(0, cfg.vocab_size, (1, 128), device=dev); mask = torch.ones(1, 128, dtype=torch.int64, device=dev)
models["bert"] = (lambda i, a: b(input_ids=i, attention_mask=a).last_hidden_state, (ids, mask))
for name, (f, args) in models.items():
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32; torch.backends.cudnn.allow_tf32 = tf32
        r = bench(f, args); results.setdefault(name, {})["eager tf32" if tf32 else "eager fp32"] = r
        print(name, "eager tf32" if tf32 else "eager fp32", "p50/p99 ms %.3f %.3f" % r, flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    for mode in ("default", "reduce-overhead"):
        try:
            t = time.perf_counter(); c = torch.compile(f, mode=mode)
            with torch.no_grad(): c(*args); torch.cuda.synchronize()
            ct = time.perf_counter() - t
            r = bench(c, args); results[name]["compile " + mode] = r
            print(name, "compile", mode, "fp32 p50/p99 ms %.3f %.3f" % r, "compile s %.1f" % ct, flush=True)
        except Exception as e:
            print(name, "compile", mode, "failed", str(e)[:200], flush=True)
print("peak GPU MiB", torch.cuda.max_memory_allocated() / 2**20)
if len(sys.argv) > 1:
    json.dump(results, open(sys.argv[1], "w"))
