"""Peers for the softmax benchmark, measured in the same run on the same GPU:
torch.softmax, the seeds' Triton online-softmax kernel (seed 003: two passes,
a fixed BLOCK_SIZE of 1024, one program per row) and the device copy
bandwidth.  Merges the engine's figures (scripts/bench_softmax.lua --json)
into one result file with the ratios.

Usage: python3 scripts/peers_softmax.py --engine E.json --json OUT.json [--commit C]
"""
import argparse
import datetime
import json

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def seeds_online_softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    row_in = in_ptr + row * in_stride
    row_out = out_ptr + row * out_stride
    m = float("-inf")
    d = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):  # pass 1: running (m, d)
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(row_in + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK_SIZE):  # pass 2: normalise
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(row_in + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = tl.exp(x - m) / d
        tl.store(row_out + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def seeds_online_softmax(x, y):
    seeds_online_softmax_kernel[(x.shape[0],)](y, x, x.stride(0), y.stride(0), x.shape[1], BLOCK_SIZE=1024)


def gbs(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--commit", default=None, help="commit measured (default: the engine JSON's)")
    args = ap.parse_args()
    with open(args.engine) as f:
        engine = json.load(f)

    big = torch.empty(1 << 29, dtype=torch.float32, device="cuda")  # 2 GiB
    dst = torch.empty_like(big)
    copy_ms = do_bench(lambda: dst.copy_(big), warmup=25, rep=200, return_mode="median")
    copy = gbs(2 * big.numel() * 4, copy_ms)
    del big, dst

    auto = {(r["dtype"], r["M"], r["N"]): r for r in engine["results"] if r["algo"] == "auto"}
    rows = []
    for (dt, M, N), r in sorted(auto.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        tdt = torch.float32 if dt == "f32" else torch.float16
        x = torch.randn(M, N, device="cuda", dtype=tdt)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()
        t_torch = do_bench(lambda: torch.softmax(x, dim=-1),
                           warmup=25, rep=100, return_mode="median")
        seeds_online_softmax(x, y)
        err = ((y.double() - torch.softmax(x.double(), -1)).norm() / torch.softmax(x.double(), -1).norm()).item()
        t_triton = do_bench(lambda: seeds_online_softmax(x, y), warmup=25, rep=100, return_mode="median")
        row = {
            "dtype": dt, "M": M, "N": N,
            "flashattn_auto_gbs": r["gbs"], "flashattn_auto_us": r["time_us"], "flashattn_rel_err": r["rel_err"],
            "torch_softmax_gbs": gbs(nbytes, t_torch), "seeds_triton_gbs": gbs(nbytes, t_triton),
            "seeds_triton_rel_err": err, "copy_gbs": copy,
        }
        row["ratio_vs_copy"] = row["flashattn_auto_gbs"] / copy
        row["ratio_vs_torch"] = row["flashattn_auto_gbs"] / row["torch_softmax_gbs"]
        row["ratio_vs_triton"] = row["flashattn_auto_gbs"] / row["seeds_triton_gbs"]
        rows.append(row)
        del x, y
        torch.cuda.empty_cache()

    result = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "commit": args.commit or engine.get("meta", {}).get("commit", "unknown"),
        "benchmark": "softmax over the last dimension, GB/s = (bytes read + written once) / median time",
        "copy_gbs": copy,
        "shapes": rows,
        "engine_all_algos": engine["results"],
    }
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"device copy {copy:.0f} GB/s on {result['gpu']}")
    print(f"{'dtype':6} {'shape':>15} {'auto GB/s':>10} {'torch':>8} {'triton':>8} {'x copy':>7} {'x torch':>8} {'x triton':>9}")
    for r in rows:
        print(f"{r['dtype']:6} {str(r['M']) + 'x' + str(r['N']):>15} {r['flashattn_auto_gbs']:10.0f} "
              f"{r['torch_softmax_gbs']:8.0f} {r['seeds_triton_gbs']:8.0f} {r['ratio_vs_copy']:7.2f} "
              f"{r['ratio_vs_torch']:8.2f} {r['ratio_vs_triton']:9.2f}")


if __name__ == "__main__":
    main()
