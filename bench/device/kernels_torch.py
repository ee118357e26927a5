"""Torch eager timings on the GPU for the same problems as kernels_check.cu (mean us of 20 runs
after 3 warm-ups, CUDA events). Writes {kernel name: us} to argv[1]; skips quietly without torch."""
import json
import sys

try:
    import torch
except ImportError:
    print("torch not importable; skipping")
    sys.exit(0)
if not torch.cuda.is_available():
    print("torch has no CUDA device; skipping")
    sys.exit(0)


def time_us(fn, iters=20):
    for _ in range(3):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return 1000.0 * a.elapsed_time(b) / iters


dev = "cuda"
out = {}
rows, vocab = 4096, 32768
x = torch.randn(rows, vocab, device=dev) * 4
tok = torch.randint(vocab, (rows,), device=dev)


def lp_gather(logits):
    return torch.log_softmax(logits.float(), -1).gather(1, tok[:, None])[:, 0]


def lp_entropy(logits):
    lsm = torch.log_softmax(logits, -1)
    return lsm.gather(1, tok[:, None])[:, 0], -(lsm.exp() * lsm).sum(-1)


out["logprob_gather_f32"] = time_us(lambda: lp_gather(x))
out["logprob_entropy_f32"] = time_us(lambda: lp_entropy(x))
xb = x.to(torch.bfloat16)
del x
out["logprob_gather_bf16"] = time_us(lambda: lp_gather(xb))
del xb

s = torch.randn(1 << 20, 16, device=dev)
out["group_advantages"] = time_us(lambda: (s - s.mean(1, keepdim=True)) / (s.std(1, keepdim=True) + 1e-6))

n = 4096 * 4096
lp = -torch.rand(n, device=dev) * 3
ref = lp + torch.randn(n, device=dev) * 0.3
mask = torch.rand(n, device=dev) < 0.8


def kl_k3():
    lr = (ref - lp).clamp(-20, 20)
    return (lr.exp() - lr - 1) * mask


out["kl_k3"] = time_us(kl_k3)

lp2, old = lp.view(4096, 4096), ref.view(4096, 4096)
adv = torch.randn(4096, 4096, device=dev)
m2 = mask.view(4096, 4096)


def policy_loss():
    x = lp2.detach().requires_grad_(True)
    ratio = (x - old).clamp(-20, 20).exp()
    l = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    l = torch.minimum(l, torch.where(adv < 0, -adv * 3.0, l))
    per_seq = (l * m2).sum(-1) / m2.sum(-1).clamp(min=1)
    loss = per_seq.mean()
    loss.backward()
    return x.grad


out["policy_loss"] = time_us(policy_loss)
del lp, ref, mask, adv

ws = [torch.randn(1024, 1024, device=dev) * 0.05 for _ in range(64)]
out["bucket_bf16_pack"] = time_us(lambda: torch.cat([w.to(torch.bfloat16).view(-1) for w in ws]))


def int8_pack():
    parts = []
    for w in ws:
        scale = w.abs().amax(1, keepdim=True) / 127
        parts.append(scale.view(-1).view(torch.uint8))
        parts.append((w / scale).round().clamp(-127, 127).to(torch.int8).view(torch.uint8).view(-1))
    return torch.cat(parts)


out["bucket_int8_pack"] = time_us(int8_pack)
json.dump(out, open(sys.argv[1], "w"))
print(json.dumps({k: round(v, 1) for k, v in out.items()}))
