"""Peers for the backward benchmark (issue 27), measured on the same GPU right
after scripts/bench_backward.lua: PyTorch's scaled_dot_product_attention
backward with the flash backend (FlashAttention-2) and the cuDNN backend
(torch.nn.attention.sdpa_kernel), and FlashAttention-2's deterministic
backward (torch.use_deterministic_algorithms(True): torch hands FA2 its
deterministic flag) beside the engine's opts.deterministic figure.

For every row of the engine's `results` (dtype bf16 or f16, B, H = Hq = Hkv,
L = Lq = Lk, D, causal; its ms / tflops / deterministic_ms) the same shapes
are made in torch, q, k, v contiguous (B, H, L, D) with requires_grad: the
forward runs once under the backend, then only the backward is timed,
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), with
triton.testing.do_bench (median; it flushes L2 between repetitions).
TFLOP/s = 2.5 x the forward's FLOPs (4 B H L^2 D, half when causal) / time,
as the engine's.  A backend that refuses a shape gets null and the reason
torch gave.  The bf16 matmul rate of this GPU (8192^3, do_bench) is measured
in the same run, and every TFLOP/s figure is also given as a fraction of it.

The output JSON: meta (date, GPU, torch, cuDNN and triton versions, commit,
the engine's meta, the matmul rate) and rows (each engine row with, per
peer, ms, tflops, fraction of the matmul rate and refused; ratio_vs_flash,
ratio_vs_cudnn = engine TFLOP/s / peer TFLOP/s; ratio_det_vs_flash_det =
engine deterministic TFLOP/s / FA2 deterministic TFLOP/s).  A readable
table goes to stdout.

Usage (GPU machine, after the engine's run):
  build-gpu/flashattn-lua scripts/bench_backward.lua --json out/backward_engine.json
  python3 scripts/peers_backward.py --engine out/backward_engine.json --json out/backward.json [--commit C]
"""
import argparse
import datetime
import json
import os
import warnings

# torch and triton are imported in main, so that --help runs anywhere
torch = triton = sdpa = sdpa_kernel = do_bench = None
BACKENDS = {}
DTYPES = {}
PEERS = ("flash", "cudnn", "flash_det")  # flash_det: FA2 with torch's deterministic algorithms on


def load():
    global torch, triton, sdpa, sdpa_kernel, do_bench
    # deterministic mode asks cuBLAS for a fixed workspace; set before CUDA starts (harmless otherwise)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch as _torch
    import triton as _triton
    try:
        import torch.utils.deterministic  # noqa: F401  (fill_uninitialized_memory, torch >= 2.1)
    except ImportError:
        pass
    from torch.nn.attention import SDPBackend, sdpa_kernel as _sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as _sdpa
    from triton.testing import do_bench as _do_bench
    torch, triton, sdpa, sdpa_kernel, do_bench = _torch, _triton, _sdpa, _sdpa_kernel, _do_bench
    BACKENDS.update({"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                     "flash_det": SDPBackend.FLASH_ATTENTION})
    DTYPES.update({"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32})


def forward_flops(B, Hq, Lq, Lk, D, causal):
    return 4.0 * B * Hq * Lq * Lk * D * (0.5 if causal else 1.0)


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12 if ms else None


class DeterministicMode:
    """torch.use_deterministic_algorithms(on) for the block, without its
    fills of uninitialised memory (which would add kernels to the timed
    backward), the previous settings restored after."""

    def __init__(self, on):
        self.on = on

    def __enter__(self):
        self.prev = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
        self.mod = getattr(torch.utils, "deterministic", None)
        self.fill = getattr(self.mod, "fill_uninitialized_memory", None)
        torch.use_deterministic_algorithms(self.on)
        if self.fill is not None:
            self.mod.fill_uninitialized_memory = False

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.prev[0], warn_only=self.prev[1])
        if self.fill is not None:
            self.mod.fill_uninitialized_memory = self.fill
        return False


def time_backward(peer, q, k, v, dout, causal, gqa):
    """Median ms of the backward alone on one peer, or (None, reason) when
    the backend refuses the call (torch says why in a warning before its
    RuntimeError)."""
    kw = {"is_causal": causal}
    if gqa:
        kw["enable_gqa"] = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with DeterministicMode(peer == "flash_det"):
                with sdpa_kernel([BACKENDS[peer]]):
                    out = sdpa(q, k, v, **kw)  # the backend is chosen here, and saved for the backward

                def step():
                    return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

                step()  # once outside the timing: a refusal of the backward raises here
                ms = do_bench(step, warmup=25, rep=100, return_mode="median")
            return ms, None
        except (RuntimeError, TypeError, NotImplementedError) as e:
            why = [str(w.message).splitlines()[0] for w in caught] + [str(e).splitlines()[0]]
            return None, "; ".join(why)[:400]


def shape_str(r):
    return (f"{r['dtype']} B={r['B']} H={r.get('H', r.get('Hq'))} L={r.get('L', r.get('Lq'))} D={r['D']} "
            f"causal={r['causal']}")


def measure_row(r, mm):
    """The peers of one engine row, merged into a copy of it."""
    Hq = r.get("Hq", r.get("H"))
    Hkv = r.get("Hkv", Hq)
    Lq = r.get("Lq", r.get("L"))
    Lk = r.get("Lk", r.get("L"))
    B, D, causal = r["B"], r["D"], bool(r["causal"])
    dt = DTYPES[r["dtype"]]
    flops = 2.5 * forward_flops(B, Hq, Lq, Lk, D, causal)
    row = dict(r)
    row["backward_flops"] = flops
    eng = r.get("tflops") or tflops(flops, r.get("ms"))
    eng_det = tflops(flops, r.get("deterministic_ms"))
    row["deterministic_tflops"] = eng_det
    row["engine_frac_matmul"] = eng / mm if eng else None
    row["engine_det_frac_matmul"] = eng_det / mm if eng_det else None
    try:
        q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt, requires_grad=True)
        k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dt, requires_grad=True)
        v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dt, requires_grad=True)
        dout = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    except RuntimeError as e:  # out of memory
        q = None
        why = str(e).splitlines()[0][:300]
    peers = {}
    for name in PEERS:
        if q is None:
            ms, refused = None, why
        else:
            ms, refused = time_backward(name, q, k, v, dout, causal, Hkv != Hq)
        t = tflops(flops, ms)
        peers[name] = {"ms": ms, "tflops": t, "frac_matmul": t / mm if t else None, "refused": refused}
    row["peers"] = peers
    for name in ("flash", "cudnn"):
        t = peers[name]["tflops"]
        row[f"ratio_vs_{name}"] = eng / t if eng and t else None
    t = peers["flash_det"]["tflops"]
    row["ratio_det_vs_flash_det"] = eng_det / t if eng_det and t else None
    del q, k, v, dout
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description="PyTorch SDPA backward peers (FA2, cuDNN, FA2 deterministic) of "
                                             "scripts/bench_backward.lua",
                                 epilog="Usage: python3 scripts/peers_backward.py --engine E.json --json OUT.json "
                                        "[--commit C]")
    ap.add_argument("--engine", required=True, help="the JSON of bench_backward.lua --json")
    ap.add_argument("--json", required=True, help="the merged result file")
    ap.add_argument("--commit", default=None, help="commit measured (default: the engine JSON's)")
    args = ap.parse_args()
    with open(args.engine) as f:
        engine = json.load(f)
    load()
    emeta = engine.get("meta", {})
    torch.manual_seed(emeta.get("seed", 1) if isinstance(emeta.get("seed"), int) else 1)
    torch.backends.cuda.matmul.allow_tf32 = False

    from peer_matmul import MATMUL_N, matmul_tflops  # here: it imports torch
    mm, mm_ms = matmul_tflops()
    print(f"bf16 matmul {MATMUL_N}^3: {mm:.0f} TFLOP/s ({mm_ms:.3f} ms)", flush=True)
    rows = []
    for r in engine.get("results", []):
        rows.append(measure_row(r, mm))
        print(f"measured {shape_str(r)}", flush=True)

    result = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "triton": triton.__version__,
            "commit": args.commit or emeta.get("commit", "unknown"),
            "matmul_bf16_tflops": mm, "matmul_bf16_ms": mm_ms, "matmul_n": MATMUL_N,
            "benchmark": "attention backward alone: TFLOP/s = 2.5 x 4 B H L^2 D (half for causal) / median time; "
                         "peers: torch SDPA's backward (torch.autograd.grad after one forward under the backend), "
                         "timed with triton.testing.do_bench (L2 flushed); flash_det = FA2 under "
                         "torch.use_deterministic_algorithms(True); ratio_vs_X = engine TFLOP/s / X TFLOP/s; "
                         "frac_matmul = TFLOP/s / the bf16 8192^3 matmul rate of the same run",
            "engine_meta": emeta,
        },
        "rows": rows,
    }
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)

    def num(x, w, f=".1f"):
        return f"{x:{w}{f}}" if isinstance(x, (int, float)) else " " * (w - 3) + "n/a"

    print(f"\nbackward TFLOP/s (2.5 x forward FLOPs / time); bf16 matmul {mm:.0f} TFLOP/s on {result['meta']['gpu']}")
    print(f"{'dtype':5} {'B':>3} {'H':>3} {'L':>6} {'D':>4} {'causal':6} {'ms':>8} {'engine':>7} {'eng det':>7} "
          f"{'FA2':>7} {'cuDNN':>7} {'FA2 det':>7} {'xFA2':>6} {'xcuDNN':>6} {'xFA2det':>7} {'eng/mm':>6} "
          f"{'FA2/mm':>6} {'cuDNN/mm':>8}")
    for r in rows:
        p = r["peers"]
        print(f"{r['dtype']:5} {r['B']:3} {r.get('H', r.get('Hq')):3} {r.get('L', r.get('Lq')):6} {r['D']:4} "
              f"{str(bool(r['causal'])):6} "
              f"{num(r.get('ms'), 8, '.3f')} {num(r.get('tflops'), 7)} {num(r.get('deterministic_tflops'), 7)} "
              f"{num(p['flash']['tflops'], 7)} {num(p['cudnn']['tflops'], 7)} {num(p['flash_det']['tflops'], 7)} "
              f"{num(r.get('ratio_vs_flash'), 6, '.2f')} {num(r.get('ratio_vs_cudnn'), 6, '.2f')} "
              f"{num(r.get('ratio_det_vs_flash_det'), 7, '.2f')} {num(r.get('engine_frac_matmul'), 6, '.2f')} "
              f"{num(p['flash']['frac_matmul'], 6, '.2f')} {num(p['cudnn']['frac_matmul'], 8, '.2f')}"
              + ("" if r.get("status", "ok") == "ok" else f"  engine {r['status']}: {r.get('error', '')}"))
    for r in rows:
        for name, p in r["peers"].items():
            if p["refused"]:
                print(f"refused: {name} on {shape_str(r)}: {p['refused']}")


if __name__ == "__main__":
    main()
