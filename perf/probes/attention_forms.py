"""One layer's decode attention at batch 16 in the forms torch offers on CPU, one thread: gathering the context by
rows or by whole blocks, SDPA on the gathered (strided) K/V or on a contiguous copy, eager matmul-softmax-matmul,
SDPA's math backend, a head-major KV pool, query groups as query positions. Shapes default to the demo model's
(8 heads, 4 KV heads, head 32) at context 224. A measurement, not a test.

    .venv/bin/python perf/probes/attention_forms.py [--batch 16] [--context 224]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed_us(fn, n: int = 300) -> float:
    for _ in range(30):  # warm-up: allocations settle (the first ones page-fault), kernels are chosen
        fn()
    began = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - began) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=224)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--block", type=int, default=16, help="slots a KV block holds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, H, KV, D, L, BS = args.batch, args.heads, args.kv_heads, args.head_dim, args.context, args.block
    slots = 16384
    k_pool, v_pool = torch.randn(slots, KV, D), torch.randn(slots, KV, D)  # (slots, n_kv, head_dim), as the engine's
    blocks = torch.randperm(slots // BS)[:B * (L // BS)].view(B, L // BS)  # each sequence's blocks, scattered
    rows = (blocks[:, :, None] * BS + torch.arange(BS)).view(-1)  # (B * L,) slots
    q = torch.randn(B, H, 1, D)
    lengths = torch.randint(L * 2 // 3, L + 1, (B,))
    mask = (torch.arange(L)[None, :] < lengths[:, None]).view(B, 1, 1, L)
    scale = D ** -0.5

    def by_rows(pool):
        return pool.index_select(0, rows).view(B, L, KV, D).transpose(1, 2)  # (B, n_kv, L, head_dim), strided

    def by_blocks(pool):
        return pool.view(-1, BS, KV, D).index_select(0, blocks.view(-1)).view(B, L, KV, D).transpose(1, 2)

    def sdpa(k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)

    def eager(k, v):
        scores = torch.matmul(q.view(B, KV, H // KV, D), k.transpose(2, 3)) * scale  # (B, n_kv, groups, L)
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
        return torch.matmul(probs, v).view(B, H, 1, D)

    def groups_as_queries(k, v):
        return F.scaled_dot_product_attention(q.view(B, KV, H // KV, D), k, v, attn_mask=mask, scale=scale)

    k, v = by_rows(k_pool), by_rows(v_pool)
    kc, vc = k.contiguous(), v.contiguous()
    k_hm, v_hm = k_pool.transpose(0, 1).contiguous(), v_pool.transpose(0, 1).contiguous()  # (n_kv, slots, head_dim)

    def head_major(pool):
        return pool.index_select(1, rows).view(KV, B, L, D).transpose(0, 1)

    reference = sdpa(k, v)
    forms = {
        "gather K by rows (index_select)": lambda: by_rows(k_pool),
        "gather K by whole blocks": lambda: by_blocks(k_pool),
        "gather K, head-major pool": lambda: head_major(k_hm),
        "contiguous copy of gathered K": lambda: k.contiguous(),
        "SDPA on gathered K/V (the engine's)": lambda: sdpa(k, v),
        "SDPA on contiguous K/V": lambda: sdpa(kc, vc),
        "SDPA on head-major gathered K/V": lambda: sdpa(head_major(k_hm), head_major(v_hm)),
        "eager matmul-softmax-matmul on gathered K/V": lambda: eager(k, v),
        "eager on contiguous K/V": lambda: eager(kc, vc),
        "SDPA, query groups as query positions, gathered": lambda: groups_as_queries(k, v),
        "SDPA, query groups as query positions, contiguous": lambda: groups_as_queries(kc, vc),
    }
    print(f"# batch {B}, heads {H} / {KV} KV, head {D}, context {L}, block {BS}, 1 thread, torch {torch.__version__}")
    print("| form | us | max abs diff to the engine's |")
    print("|---|---|---|")
    for name, fn in forms.items():
        out = fn()
        diff = f"{(out - reference).abs().max().item():.1e}" if out.shape == reference.shape else "-"
        print(f"| {name} | {timed_us(fn):.0f} | {diff} |")
    with sdpa_kernel(SDPBackend.MATH):
        print(f"| SDPA, math backend, gathered K/V | {timed_us(lambda: sdpa(k, v)):.0f} | "
              f"{(sdpa(k, v) - reference).abs().max().item():.1e} |")


if __name__ == "__main__":
    main()
