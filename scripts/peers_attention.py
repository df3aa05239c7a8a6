"""Peers for the attention benchmark, measured in the same run on the same GPU:
PyTorch's scaled_dot_product_attention with the flash (FlashAttention-2),
cuDNN and efficient backends, and the bf16 matmul rate of the same run
(peer_matmul.py: each row's engine_frac_matmul, the issue's "fraction of the
matmul rate").  Merges the engine's figures
(scripts/bench_attention.lua --json) into one result file with the ratios.
Rows with a score rule (bench_attention.lua --rules) are set against SDPA
given the same rule as its attn_mask, on the backends that take one: the
float mask (1, 1, L, L) in the query's dtype, the bool mask (same pattern),
alibi as a (1, H, L, L) bias; softcap has no SDPA form (no peer).

Usage: python3 scripts/peers_attention.py --engine E.json --json OUT.json [--commit C]
"""
import argparse
import datetime
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from triton.testing import do_bench

from peer_matmul import MATMUL_N, matmul_tflops

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def rule_mask(rule, dt, H, L, causal):
    """SDPA's attn_mask for a rule of bench_attention.lua (None: plain), with
    causal folded in (SDPA takes is_causal or a mask, not both); False when
    SDPA has no form of it."""
    if rule == "plain":
        return None
    if rule == "softcap":
        return False
    i = torch.arange(L, device="cuda").view(L, 1)
    j = torch.arange(L, device="cuda").view(1, L)
    if rule == "mask_bool":
        keep = (i * 7 + j * 3) % 10 != 0
        return (keep & (j <= i) if causal else keep).view(1, 1, L, L)
    if rule == "mask_float":
        m = torch.rand(1, 1, L, L, device="cuda", dtype=DTYPES[dt]) - 1
    elif rule == "alibi":
        slopes = torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)], device="cuda").view(1, H, 1, 1)
        m = (-slopes * (i - j).abs().view(1, 1, L, L)).to(DTYPES[dt])
    else:
        return False
    return m.masked_fill(j > i, float("-inf")) if causal else m


def peer_tflops(backend, dt, B, H, L, D, causal, mask=None):
    """mask: rule_mask's (None: plain, False: no SDPA form)."""
    if mask is False:
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=DTYPES[dt]) for _ in range(3))
    kw = {"is_causal": causal} if mask is None else {"attn_mask": mask}
    try:
        with sdpa_kernel([BACKENDS[backend]]):
            sdpa(q, k, v, **kw)
            ms = do_bench(lambda: sdpa(q, k, v, **kw), warmup=10, rep=50, return_mode="median")
    except RuntimeError:
        return None
    flops = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--commit", default=None, help="commit measured (default: the engine JSON's)")
    args = ap.parse_args()
    with open(args.engine) as f:
        engine = json.load(f)
    torch.backends.cuda.matmul.allow_tf32 = False
    mm, mm_ms = matmul_tflops()
    print(f"bf16 matmul {MATMUL_N}^3: {mm:.0f} TFLOP/s ({mm_ms:.3f} ms)", flush=True)
    rows = []
    peers = {}  # a shape's peer figures, measured once for every engine row of it ("flash", "flash@KERNEL")
    for r in engine["results"]:
        if r["algo"] != "flash" and not r["algo"].startswith("flash@"):
            continue
        row = dict(r)
        shape = (r["dtype"], r["B"], r["H"], r["L"], r["D"], r["causal"], r.get("rule", "plain"))
        if shape not in peers:
            mask = rule_mask(r.get("rule", "plain"), r["dtype"], r["H"], r["L"], r["causal"])  # once for the backends
            peers[shape] = {name: peer_tflops(name, r["dtype"], r["B"], r["H"], r["L"], r["D"], r["causal"], mask)
                            for name in BACKENDS}
            mask = None  # freed before the next shape
            torch.cuda.empty_cache()
        for name in BACKENDS:
            t = peers[shape][name]
            row[f"torch_{name}_tflops"] = t
            row[f"ratio_vs_{name}"] = r["tflops"] / t if t else None
        row["engine_frac_matmul"] = r["tflops"] / mm
        rows.append(row)
    result = {
        "date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
        "commit": args.commit or engine.get("meta", {}).get("commit", "unknown"),
        "benchmark": "attention forward, TFLOP/s = 4·B·H·L²·D (half for causal) / median time",
        # the engine's timing: behind a 256 MiB flush as do_bench times the peers (True), or started on an idle
        # device with the host's queueing inside the span (False: bench_attention.lua before 2026-12-03, or --no-flush)
        "engine_flush_cache": engine.get("flush_cache", False),
        "matmul_bf16_tflops": mm, "matmul_bf16_ms": mm_ms, "matmul_n": MATMUL_N,
        "shapes": rows, "engine_all_algos": engine["results"],
    }
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    fmt = lambda x: f"{x:7.1f}" if x else "    n/a"
    print(f"{'dtype':5} {'D':>4} {'L':>6} {'causal':6} {'rule':10} {'algo':15} {'engine':>7} {'FA2':>7} {'cuDNN':>7} {'effic':>7} {'xFA2':>6} {'xcuDNN':>7} {'xeff':>6} {'xmm':>5}")
    for r in rows:
        rat = lambda k: f"{r[k]:6.2f}" if r[k] else "   n/a"
        print(f"{r['dtype']:5} {r['D']:4} {r['L']:6} {str(r['causal']):6} {r.get('rule', 'plain'):10} {r['algo']:15} {r['tflops']:7.1f} "
              f"{fmt(r['torch_flash_tflops'])} {fmt(r['torch_cudnn_tflops'])} {fmt(r['torch_efficient_tflops'])} "
              f"{rat('ratio_vs_flash')} {rat('ratio_vs_cudnn'):>7} {rat('ratio_vs_efficient')} {r['engine_frac_matmul']:5.2f}")


if __name__ == "__main__":
    main()
