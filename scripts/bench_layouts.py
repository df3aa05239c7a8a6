"""Attention on the layouts hosts hold (API §6), against FlashAttention-2 and
cuDNN on the very same views, in one process on one GPU.

Layouts: "bhld" (contiguous (B, H, L, D): the baseline), "blhd" (q, k, v and
the output as transposed views of (B, L, H, D) tensors: FlashAttention's and
PyTorch's native layout) and "packed" (q, k, v sliced from one (B, L, 3, H,
D) tensor, the output a transposed view).  The engine is driven through its
C API over torch's memory (scripts/oracle_attention.py's Engine: zero copy,
torch's stream), its output preallocated in the same layout; the peers are
PyTorch SDPA's flash (FA2) and cuDNN backends on the same views.  Times are
medians of Triton's do_bench (L2 flushed before every repetition), TFLOP/s =
4·B·H·L²·D (half for causal) / time.  Each shape's engine output is checked
against FA2's on the same views (max |diff|).

Usage (GPU machine, after scripts/gpu_env.sh and a build):
  python3 scripts/bench_layouts.py --lib build-gpu/libflashattn.so [--json OUT.json] [--commit C]
      [--dtypes bf16,f16] [--dims 64,128,256] [--lengths 1024,4096,16384] [--causal both]
      [--rounds N]  (default 3: the layouts' engine calls timed in turns, each strided call set
                     against the contiguous one of its round; the median ratio)
      [--also-kernel NAME]  (a registry kernel also timed on the same views, e.g. wgmma)
"""
import argparse
import ctypes
import datetime
import json
import os
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fa_ctypes import CAUSAL, AttnOpts  # noqa: E402
from oracle_attention import Engine  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
PEERS = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
LAYOUTS = ("bhld", "blhd", "packed")


def operands(layout, dt, B, H, L, D):
    """q, k, v and an output buffer, all (B, H, L, D) views in the layout."""
    if layout == "bhld":
        q, k, v, o = (torch.randn(B, H, L, D, device="cuda", dtype=dt) for _ in range(4))
    elif layout == "blhd":
        q, k, v, o = (torch.randn(B, L, H, D, device="cuda", dtype=dt).transpose(1, 2) for _ in range(4))
    else:
        qkv = torch.randn(B, L, 3, H, D, device="cuda", dtype=dt)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        o = torch.empty(B, L, H, D, device="cuda", dtype=dt).transpose(1, 2)
    return q, k, v, o


class EngineCall:
    """One fa_attention call on fixed operands, ready to repeat."""

    def __init__(self, eng, dtype, q, k, v, out, causal, kernel=None):
        self.eng, self.lib = eng, eng.lib
        self.kernel = kernel.encode() if kernel else None  # opts.kernel: a registry entry by name
        self.held = [eng.wrap(t, dtype) for t in (q, k, v, out)]
        self.opts = AttnOpts()
        self.lib.fa_attention_opts_init(ctypes.byref(self.opts))
        self.opts.causal = CAUSAL["bottom_right" if causal else "none"]
        self.opts.out = self.held[3]
        if self.kernel:
            self.opts.kernel = self.kernel
        self.ro = ctypes.c_void_p()

    def __call__(self):
        tq, tk, tv, _ = self.held
        self.eng.check(self.lib.fa_attention(self.eng.ctx, tq, tk, tv, ctypes.byref(self.opts), ctypes.byref(self.ro),
                                             None), "fa_attention")
        self.lib.fa_tensor_release(self.ro)  # the same tensor as out, retained for the caller

    def close(self):
        for t in self.held:
            self.lib.fa_tensor_release(t)


def tflops(ms, B, H, L, D, causal):
    return 4.0 * B * H * L * L * D * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12


def bench(fn):
    fn()
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def print_row(row, also):
    f = lambda x: f"{x:7.1f}" if x else "    n/a"
    g = lambda x: f"{x:6.2f}" if x else "   n/a"
    print(f"{row['dtype']:5} {row['D']:4} {row['L']:6} {str(row['causal']):6} {row['layout']:7} {row['tflops']:7.1f} "
          f"{f(row.get('fa2_tflops'))} {f(row.get('cudnn_tflops'))} {g(row['ratio_vs_fa2'])} "
          f"{g(row['ratio_vs_cudnn'])} {g(row['ratio_vs_contiguous'])} "
          f"{row.get('maxdiff_vs_fa2', float('nan')):8.2g}" + (f" {also} {row[f'tflops_{also}']:7.1f}" if also else ""),
          flush=True)


def shape_rows(a, eng, dname, dt, B, H, L, D, causal):
    """The rows of one shape, a layout each: the engine's call on the three layouts timed in turns,
    a.rounds times (bhld, blhd, packed, bhld, ...), so that each strided layout is set against the
    contiguous call of the same round (ratio_vs_contiguous: the median of the rounds' ratios; tflops:
    the median of the rounds); the peers once a layout."""
    ops = {layout: operands(layout, dt, B, H, L, D) for layout in LAYOUTS}
    calls = {layout: EngineCall(eng, dname, *ops[layout], causal) for layout in LAYOUTS}
    times = {layout: [] for layout in LAYOUTS}
    for _ in range(a.rounds):
        for layout in LAYOUTS:
            times[layout].append(bench(calls[layout]))
    rows = []
    for layout in LAYOUTS:
        q, k, v, o = ops[layout]
        call = calls[layout]
        row = {"dtype": dname, "B": B, "H": H, "L": L, "D": D, "causal": causal, "layout": layout,
               "rounds": a.rounds, "ms": times[layout]}
        row["tflops"] = tflops(statistics.median(times[layout]), B, H, L, D, causal)
        row["ratio_vs_contiguous"] = statistics.median(b / t for b, t in zip(times["bhld"], times[layout]))
        if a.also_kernel:
            named = EngineCall(eng, dname, q, k, v, o, causal, a.also_kernel)
            row[f"tflops_{a.also_kernel}"] = tflops(bench(named), B, H, L, D, causal)
            named.close()
        for name, backend in PEERS.items():
            try:
                with sdpa_kernel([backend]):
                    ref = sdpa(q, k, v, is_causal=causal)
                    row[f"{name}_tflops"] = tflops(bench(lambda: sdpa(q, k, v, is_causal=causal)), B, H, L, D, causal)
                if name == "fa2":
                    call()
                    torch.cuda.synchronize()
                    row["maxdiff_vs_fa2"] = (o.float() - ref.float()).abs().max().item()
            except RuntimeError:
                row[f"{name}_tflops"] = None
        row["ratio_vs_fa2"] = row["tflops"] / row["fa2_tflops"] if row.get("fa2_tflops") else None
        row["ratio_vs_cudnn"] = row["tflops"] / row["cudnn_tflops"] if row.get("cudnn_tflops") else None
        rows.append(row)
        print_row(row, a.also_kernel)
    for call in calls.values():
        call.close()
    del ops
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build-gpu/libflashattn.so")
    ap.add_argument("--json", default=None)
    ap.add_argument("--commit", default=os.environ.get("FA_COMMIT") or "unknown",
                    help="the commit measured (default: FA_COMMIT, which scripts/gpu_carried.sh sets)")
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--tokens", type=int, default=16384, help="B·L")
    ap.add_argument("--width", type=int, default=2048, help="H·D")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the three layouts' engine calls, timed in turns (ratios: within a round)")
    ap.add_argument("--also-kernel", default=None,
                    help="a kernel (opts.kernel) also timed on every layout, beside the engine's choice")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    eng = Engine(a.lib)
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    rows = []
    print(f"{'dtype':5} {'D':>4} {'L':>6} {'causal':6} {'layout':7} {'engine':>7} {'FA2':>7} {'cuDNN':>7} "
          f"{'xFA2':>6} {'xcuDNN':>6} {'xbhld':>6} {'maxdiff':>8}", flush=True)
    for dname in a.dtypes.split(","):
        dt = DTYPES[dname]
        for D in map(int, a.dims.split(",")):
            H = a.width // D
            for L in map(int, a.lengths.split(",")):
                B = max(1, a.tokens // L)
                for causal in causals:
                    rows += shape_rows(a, eng, dname, dt, B, H, L, D, causal)
    eng.close()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "commit": a.commit, "command": " ".join(sys.argv),
                       "benchmark": "attention forward on host layouts (API §6), TFLOP/s = 4·B·H·L²·D (half for "
                                    "causal) / median do_bench time (L2 flushed); peers: SDPA flash (FA2) and cuDNN "
                                    "on the same views", "shapes": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
