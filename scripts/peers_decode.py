"""Peers for the decode benchmark (issue 24), measured on the same GPU right
after scripts/bench_decode.lua: PyTorch's scaled_dot_product_attention with
the flash backend and the cuDNN backend (torch.nn.attention.sdpa_kernel) on
every shape of the engine's `results` (bf16, q (B, Hq, Lq, D), k and v
(B, Hkv, Lk, D), no mask), timed with triton.testing.do_bench (median; it
flushes L2 between repetitions).

GQA (Hkv < Hq) is first asked for natively (enable_gqa=True).  A backend
that refuses it is recorded as refusing (null, with the reason torch gave)
and measured again on K/V expanded to Hq heads by repeat_interleave: the
"expanded" figures, whose GB/s still count the Hkv bytes of K + V (the
engine's kv_bytes), so that every GB/s of a shape divides the same bytes.
An expansion that does not fit in the free device memory is recorded as
skipped.  A tiny-call row (B = 1, Hkv = 8, Lk = 256, Lq = 1) times 1000
calls of each backend with the host clock, as the engine's tiny_call.

The output JSON: meta (date, GPU, torch, cuDNN and triton versions, commit,
the engine's meta), shapes (each engine row, each peer's ms and GB/s,
ratio_vs_<peer> = engine GB/s / peer GB/s, best_peer and ratio_vs_best),
and the engine's paged, tiny_call and skipped as they were, plus the peers'
tiny-call figures.  A readable table goes to stdout.

Usage (GPU machine, after the engine's run):
  build-gpu/flashattn-lua scripts/bench_decode.lua --json out/decode.json
  python3 scripts/peers_decode.py --engine out/decode.json --json out/decode_peers.json [--commit C]
"""
import argparse
import datetime
import json
import time
import warnings

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from triton.testing import do_bench

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
TINY_CALLS = 1000


def run_backend(backend, q, k, v, **kw):
    """Median ms of sdpa on one backend, or (None, reason) when it refuses
    the call (torch says why in a warning before its RuntimeError)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([BACKENDS[backend]]):
                sdpa(q, k, v, **kw)  # once outside the timing: a refusal raises here
                ms = do_bench(lambda: sdpa(q, k, v, **kw), warmup=25, rep=100, return_mode="median")
            return ms, None
        except (RuntimeError, TypeError) as e:  # TypeError: a torch without enable_gqa
            why = [str(w.message).splitlines()[0] for w in caught] + [str(e).splitlines()[0]]
            return None, "; ".join(why)[:400]


def gbs(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9 if ms else None


def measure_shape(r):
    """Peer figures of one engine row: {peer name: {ms, gbs, refused}}."""
    B, Hq, Hkv, Lq, Lk, D = r["B"], r["Hq"], r["Hkv"], r["Lq"], r["Lk"], r["D"]
    dt = DTYPES[r["dtype"]]
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dt)
    v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dt)
    kw = {"enable_gqa": True} if Hkv < Hq else {}
    peers, refused = {}, []
    for name in BACKENDS:
        ms, why = run_backend(name, q, k, v, **kw)
        peers[name] = {"ms": ms, "gbs": gbs(r["kv_bytes"], ms), "refused": why}
        if why and Hkv < Hq:
            refused.append(name)
    if refused:
        # the originals go before the expansion (g times their size) is made
        g = Hq // Hkv
        need = r["kv_bytes"] * g
        del k, v
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        if need > 0.9 * free:
            for name in refused:
                peers[name + "_expanded"] = {"ms": None, "gbs": None,
                                             "refused": f"skipped: expanded K + V ({need / 2**30:.0f} GiB) do not fit"}
        else:
            try:
                k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dt).repeat_interleave(g, dim=1)
                v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dt).repeat_interleave(g, dim=1)
            except RuntimeError as e:  # out of memory after all
                k = None
                for name in refused:
                    peers[name + "_expanded"] = {"ms": None, "gbs": None, "refused": str(e).splitlines()[0]}
            if k is not None:
                for name in refused:
                    ms, why = run_backend(name, q, k, v)
                    # GB/s on the Hkv bytes, the engine's kv_bytes, though Hq heads were read
                    peers[name + "_expanded"] = {"ms": ms, "gbs": gbs(r["kv_bytes"], ms), "refused": why}
    del q
    torch.cuda.empty_cache()
    return peers


def tiny_call(backend, dtype):
    """Host wall clock per call of TINY_CALLS calls, synchronized at the end, in µs."""
    dt = DTYPES[dtype]
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=dt)
    k = torch.randn(1, 8, 256, 128, device="cuda", dtype=dt)
    v = torch.randn(1, 8, 256, 128, device="cuda", dtype=dt)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with sdpa_kernel([BACKENDS[backend]]):
                walls = []
                for _ in range(4):  # the first is the warm-up
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(TINY_CALLS):
                        sdpa(q, k, v, enable_gqa=True)
                    torch.cuda.synchronize()
                    walls.append(time.perf_counter() - t0)
        return sorted(walls[1:])[1] * 1e6 / TINY_CALLS
    except (RuntimeError, TypeError):
        return None


def main():
    ap = argparse.ArgumentParser(description="PyTorch SDPA peers of scripts/bench_decode.lua")
    ap.add_argument("--engine", required=True, help="the JSON of bench_decode.lua --json")
    ap.add_argument("--json", required=True, help="the merged result file")
    ap.add_argument("--commit", default=None, help="commit measured (default: the engine JSON's)")
    args = ap.parse_args()
    with open(args.engine) as f:
        engine = json.load(f)
    emeta = engine.get("meta", {})
    torch.manual_seed(emeta.get("seed", 1) if isinstance(emeta.get("seed"), int) else 1)
    torch.backends.cuda.matmul.allow_tf32 = False

    shapes = []
    for r in engine["results"]:
        row = dict(r)
        row["peers"] = measure_shape(r)
        figures = {n: p["gbs"] for n, p in row["peers"].items() if p["gbs"]}
        for n, g in figures.items():
            row[f"ratio_vs_{n}"] = r["kv_gbs"] / g if r.get("kv_gbs") else None
        if figures:
            best = max(figures, key=figures.get)
            row["best_peer"], row["best_peer_gbs"] = best, figures[best]
            row["ratio_vs_best"] = r["kv_gbs"] / figures[best] if r.get("kv_gbs") else None
        shapes.append(row)
        print(f"measured B={r['B']} Hkv={r['Hkv']} Lq={r['Lq']} Lk={r['Lk']}", flush=True)

    dtype = engine["results"][0]["dtype"] if engine["results"] else "bf16"
    result = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "triton": triton.__version__,
            "commit": args.commit or emeta.get("commit", "unknown"),
            "benchmark": "decode: GB/s = bytes of K + V (Hkv heads) / median time; peers timed with "
                         "triton.testing.do_bench (L2 flushed); ratio_vs_X = engine GB/s / X GB/s; "
                         "X_expanded = K/V repeat_interleaved to Hq heads where X refused enable_gqa, "
                         "GB/s still on the Hkv bytes",
            "engine_meta": emeta,
        },
        "shapes": shapes,
        "paged": engine.get("paged") or [],
        "tiny_call": engine.get("tiny_call"),
        "peers_tiny_call_us": {name: tiny_call(name, dtype) for name in BACKENDS},
        "skipped": engine.get("skipped") or [],
    }
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)

    def num(x, w, f=".0f"):
        return f"{x:{w}{f}}" if isinstance(x, (int, float)) else " " * (w - 3) + "n/a"

    print(f"\n{'B':>3} {'Hkv':>3} {'Lq':>3} {'Lk':>7} {'engine':>7} {'x copy':>6} {'x same':>6} {'FA2':>7} {'cuDNN':>7} "
          f"{'FA2 exp':>7} {'cuDNN ex':>8} {'best':>14} {'x best':>6}   (GB/s of K + V)")
    for r in shapes:
        p = r["peers"]
        g = lambda n: p.get(n, {}).get("gbs")
        print(f"{r['B']:3} {r['Hkv']:3} {r['Lq']:3} {r['Lk']:7} {num(r.get('kv_gbs'), 7)} "
              f"{num(r.get('copy_ratio'), 6, '.2f')} {num(r.get('same_copy_ratio'), 6, '.2f')} {num(g('flash'), 7)} {num(g('cudnn'), 7)} "
              f"{num(g('flash_expanded'), 7)} {num(g('cudnn_expanded'), 8)} {r.get('best_peer', 'n/a'):>14} "
              f"{num(r.get('ratio_vs_best'), 6, '.2f')}")
    for r in result["paged"]:
        print(f"paged B={r['B']} Hkv={r['Hkv']} Lk={r['Lk']} page={r['page_size']}: "
              f"{num(r.get('ms'), 0, '.4f')} ms, {num(r.get('contiguous_ratio'), 0, '.2f')} x contiguous "
              f"({r.get('status')})")
    t = result["tiny_call"] or {}
    print(f"tiny call µs: engine wall {num(t.get('wall_us_per_call'), 0, '.2f')}, "
          + ", ".join(f"{n} {num(u, 0, '.2f')}" for n, u in result["peers_tiny_call_us"].items()))
    for s in result["skipped"]:
        print(f"skipped B={s['B']} Hkv={s['Hkv']} Lk={s['Lk']}: {s['reason']}")


if __name__ == "__main__":
    main()
