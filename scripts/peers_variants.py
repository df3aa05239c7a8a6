"""Peers for the variants benchmark (issue 26, API §9), measured on the same GPU
right after scripts/bench_variants.lua: PyTorch's FlexAttention
(torch.nn.attention.flex_attention.flex_attention under torch.compile) on
exactly the cases the engine ran, with the same rules written as FlexAttention
score_mod / mask_mod functions.

Cases (0-based b, h, q_idx, kv_idx; the Lua side writes the same rules with
1-based positions):
  alibi             score - slopes[h] * |q - kv|, slopes[h] = 2^(-8 (h + 1) / H)
                    (the engine's 2^(-8h/H) with 1-based h); no mask
  softcap           tanh(score / 30) * 30 (the cap from the engine's meta,
                    30 by default); score is already scaled by 1/sqrt(D); no mask
  sliding           mask q >= kv and q - kv <= W (W = the row's window)
  document          mask doc[q] == doc[kv] and q >= kv, doc[] from the row's
                    doc_lengths (document 0 holds the first doc_lengths[0]
                    positions, and so on)
  prefix_lm         mask kv < prefix or q >= kv (prefix = the row's prefix;
                    the Lua rule k <= prefix, 1-based)
  alibi+sliding     both;  softcap+document: both
For every row of the engine's `results` (dtype, B, H, L, D, pairs, window,
prefix, doc_lengths) q, k, v (B, H, L, D) are drawn with torch.randn (seeded
from the engine's meta; the values need not match the engine's), contiguous.

Backends:
  flex_triton  torch.compile(flex_attention) as is (its Triton kernels), with
               create_block_mask(mask_mod, B=None, H=None, Q_LEN=L, KV_LEN=L,
               BLOCK_SIZE=128) built once outside the timing for the cases
               with a mask, block_mask=None otherwise.
  flex_flash   the same with kernel_options={"BACKEND": "FLASH"}: FlexAttention's
               FlashAttention CuTe-DSL backend (PyTorch >= 2.9 with
               flash_attn.cute installed).  A PyTorch whose FlexKernelOptions
               has no BACKEND key is not asked (an unknown option could be
               ignored and time Triton under this name); if the call raises
               with a mask at BLOCK_SIZE 128, it is tried once more at
               (256, 128), the Q block Blackwell's kernel wants, and the
               block size that ran is recorded.
torch._dynamo is reset before each backend of each case, so the first call
compiles afresh (its wall time, synchronised, is compile_s; one small
compile before the cases takes inductor's one-time start out of it, and
inductor's disk caches may still hold kernels of an earlier run) and no
recompile limit can drop a later case to eager.  Timing: triton.testing.do_bench (L2 flushed
before each repetition, the median), as the engine's fa.bench.  TFLOP/s =
4 * D * pairs * B * H / time with the engine row's pairs, the engine's count.
A backend that fails (compile, launch, out of memory) is recorded with
refused = the exception's first line, and the run goes on.

Checks (no effect on the timing): the output must be finite, and on a slice
(batch 0, every head, --check-rows query rows spread over L) it is compared
with a float32 reference computed from the same rules (rel_err =
||out - ref|| / ||ref||, check "ok" when finite and rel_err <= 2e-2 for
bf16/f16, the engine's tolerance).  The pairs the rules attend are counted
here too and set against the engine's (pairs_here).

The bf16 matmul rate of this GPU (8192^3, do_bench) is measured in the same
run; every TFLOP/s figure is also given as a fraction of it.

The output JSON: meta (date, GPU, torch / triton / flash_attn versions,
commit, the matmul rate, the engine's meta), rows (each engine row, whatever
its status, with peers.<backend> = {ms, tflops, frac_matmul, refused,
compile_s, block_size, block_mask_s, block_sparsity_pct, finite, rel_err,
check, ratio, note}, ratio = engine TFLOP/s / that backend's TFLOP/s,
ratio_vs_<backend> likewise, best_peer and ratio_vs_best = engine TFLOP/s /
the fastest backend's TFLOP/s, among those whose check did not fail; all
null where the engine's status is not "ok", the peers measured all the
same), and host (the engine's host figures).  A readable table goes to
stdout.

Usage (GPU machine, after the engine's run):
  build-gpu/flashattn-lua scripts/bench_variants.lua --json out/variants.json
  python3 scripts/peers_variants.py --engine out/variants.json --json out/variants_peers.json [--commit C]
"""
import argparse
import datetime
import importlib.util
import inspect
import json
import math
import time

# torch and triton are imported in main (load), so that --help runs anywhere
torch = triton = flex_attention = create_block_mask = do_bench = None
DTYPES = {}
BACKENDS = ("flex_triton", "flex_flash")
TOLERANCE = {"bf16": 2e-2, "f16": 2e-2, "f32": 1e-5}  # the engine's sweep.TOLERANCE
SCORE_PARTS = ("alibi", "softcap")
MASK_PARTS = ("sliding", "document", "prefix_lm")


def load():
    global torch, triton, flex_attention, create_block_mask, do_bench
    import torch as _torch
    import torch._dynamo  # noqa: F401  (its config and reset, used below)
    import triton as _triton
    from torch.nn.attention.flex_attention import create_block_mask as _cbm, flex_attention as _flex
    from triton.testing import do_bench as _do_bench
    torch, triton, flex_attention, create_block_mask, do_bench = _torch, _triton, _flex, _cbm, _do_bench
    DTYPES.update({"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32})
    # every case compiles its own graphs: a generous limit, on top of the reset
    # before each backend, so that nothing falls back to eager (old and new names)
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))


def flash_support():
    """None when this PyTorch takes kernel_options={"BACKEND": "FLASH"}, else
    why not.  Asked before any call: an older PyTorch might not reject the
    unknown option, and would then time its Triton kernel under this name."""
    import torch.nn.attention.flex_attention as fa_mod
    opts = getattr(fa_mod, "FlexKernelOptions", None)
    keys = getattr(opts, "__annotations__", {}) if opts is not None else {}
    try:
        has_module = importlib.util.find_spec("torch._inductor.kernel.flex.flex_flash_attention") is not None
    except (ImportError, ValueError):
        has_module = False
    if "BACKEND" in keys or has_module:
        return None
    return f"torch {torch.__version__} has no FlexAttention BACKEND kernel option (PyTorch >= 2.9 has)"


def flash_attn_version():
    """The flash_attn package's version (the FLASH backend's kernels), or None."""
    try:
        import importlib.metadata as md
    except ImportError:
        return None
    for dist in ("flash-attn-cute", "flash_attn_cute", "flash-attn", "flash_attn"):
        try:
            return f"{dist} {md.version(dist)}"
        except Exception:  # noqa: BLE001  (not installed under that name)
            continue
    return None


def reason(e):
    """The exception's first line; dynamo's wrappers open with 'backend=... raised:',
    so a first line ending in ':' gets the next non-empty line too."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    if not lines:
        return type(e).__name__
    why = lines[0]
    if why.endswith(":") and len(lines) > 1:
        why += " " + lines[1]
    return f"{type(e).__name__}: {why}"[:400]


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12 if ms else None


def bench_ms(fn, warmup, rep):
    """do_bench's median (ms); older triton has quantiles, not return_mode."""
    params = inspect.signature(do_bench).parameters
    if "return_mode" in params:
        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    r = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])
    return r[0] if isinstance(r, (list, tuple)) else r


def warm_compiler(flex):
    """One small compile before the cases, so that the first case's compile_s
    does not carry inductor's one-time start (imports, compile workers)."""
    t0 = time.perf_counter()
    try:
        x = torch.randn(1, 1, 256, 64, device="cuda", dtype=torch.bfloat16)
        flex(x, x, x)
        torch.cuda.synchronize()
        del x
    except Exception as ex:  # noqa: BLE001  (the cases will say what fails)
        print(f"compiler warm-up failed: {reason(ex)}", flush=True)
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return time.perf_counter() - t0


def case_parts(case):
    """'alibi+sliding' -> (['alibi'], ['sliding']); None for a name not known here."""
    parts = case.split("+")
    if any(p not in SCORE_PARTS + MASK_PARTS for p in parts):
        return None
    return [p for p in parts if p in SCORE_PARTS], [p for p in parts if p in MASK_PARTS]


def make_mods(case, row, softcap):
    """(score_mod, mask_mod) of a case, each None where the case has none.
    Written with broadcasting torch ops only, so the same functions serve
    FlexAttention (scalar index tensors) and the reference (index grids)."""
    score_parts, mask_parts = case_parts(case)
    H, L = int(row["H"]), int(row["L"])
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device="cuda", dtype=torch.float32)
    W = int(row.get("window") or 0)
    prefix = int(row.get("prefix") or 0)
    doc = None
    if "document" in mask_parts:
        lens = [int(n) for n in row.get("doc_lengths") or []]
        if sum(lens) != L or min(lens, default=0) <= 0:
            raise ValueError(f"doc_lengths sum to {sum(lens)}, not L = {L}")
        doc = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32),
                                      torch.tensor(lens)).to("cuda")

    def alibi(score, b, h, q, kv):
        return score - slopes[h] * (q - kv).abs()

    def cap(score, b, h, q, kv):
        return torch.tanh(score / softcap) * softcap

    def sliding(b, h, q, kv):
        return (q >= kv) & (q - kv <= W)

    def document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    def prefix_lm(b, h, q, kv):
        return (kv < prefix) | (q >= kv)

    scores = [{"alibi": alibi, "softcap": cap}[p] for p in score_parts]
    masks = [{"sliding": sliding, "document": document, "prefix_lm": prefix_lm}[p] for p in mask_parts]
    # one part each in every case the engine writes; a longer list is chained / and-ed
    score_mod = mask_mod = None
    if len(scores) == 1:
        score_mod = scores[0]
    elif scores:
        def score_mod(score, b, h, q, kv):
            for f in scores:
                score = f(score, b, h, q, kv)
            return score
    if len(masks) == 1:
        mask_mod = masks[0]
    elif masks:
        def mask_mod(b, h, q, kv):
            keep = masks[0](b, h, q, kv)
            for f in masks[1:]:
                keep = keep & f(b, h, q, kv)
            return keep
    return score_mod, mask_mod


def pairs_here(case, row):
    """Attended (q, kv) pairs of one (batch, head), counted from the rules as
    written here (None for more than one mask), to set against the engine's."""
    L = int(row["L"])
    _, masks = case_parts(case)
    if not masks:
        return L * L
    if len(masks) > 1:
        return None
    m = masks[0]
    if m == "sliding":
        W = int(row["window"])
        return sum(min(i + 1, W + 1) for i in range(L))
    if m == "document":
        return sum(n * (n + 1) // 2 for n in (int(x) for x in row["doc_lengths"]))
    prefix = int(row["prefix"])
    return sum(max(i + 1, prefix) for i in range(L))


def reference_slice(q, k, v, score_mod, mask_mod, rows):
    """float32 attention of batch 0, every head, the query rows given: the
    rules applied to the full score grid of those rows (H x R x L)."""
    H, L, D = q.shape[1], q.shape[2], q.shape[3]
    s = (q[0, :, rows].float() @ k[0].float().transpose(-1, -2)) * (1.0 / math.sqrt(D))
    b = torch.zeros((), dtype=torch.int64, device="cuda")
    h = torch.arange(H, device="cuda").view(H, 1, 1)
    qi = rows.view(1, -1, 1)
    kv = torch.arange(L, device="cuda").view(1, 1, L)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, kv), float("-inf"))
    return torch.softmax(s, dim=-1) @ v[0].float()


def measure_backend(name, flex, q, k, v, score_mod, mask_mod, flops, mm, args, check_rows, tol, flash_refusal):
    """One backend on one case: compile (timed apart), check, time.  Every
    failure is caught and recorded; the entry always comes back."""
    e = {"ms": None, "tflops": None, "frac_matmul": None, "refused": None, "compile_s": None,
         "block_size": None, "block_mask_s": None, "block_sparsity_pct": None, "finite": None,
         "rel_err": None, "check": None, "ratio": None, "note": None}
    if name == "flex_flash" and flash_refusal:
        e["refused"] = flash_refusal
        return e
    opts = {"BACKEND": "FLASH"} if name == "flex_flash" else None
    L = q.shape[2]
    block_sizes = [128]
    if name == "flex_flash" and mask_mod is not None:
        block_sizes.append((256, 128))  # the Q block the FLASH kernel wants on Blackwell
    tried = []
    for bs in block_sizes:
        bm = out = None
        try:
            if mask_mod is not None:
                t0 = time.perf_counter()
                bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=L, KV_LEN=L, device="cuda", BLOCK_SIZE=bs)
                torch.cuda.synchronize()
                e["block_mask_s"] = time.perf_counter() - t0
                e["block_sparsity_pct"] = float(bm.sparsity())
            torch._dynamo.reset()  # a fresh compile per backend and case (see the docstring)

            def call():
                return flex(q, k, v, score_mod=score_mod, block_mask=bm, kernel_options=opts)

            t0 = time.perf_counter()
            out = call()
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            finite = bool(torch.isfinite(out).all().item())
            rel = None
            if finite and check_rows is not None:
                ref = reference_slice(q, k, v, score_mod, mask_mod, check_rows)
                got = out[0, :, check_rows].float()
                rel = float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref))
                del ref, got
            del out
            out = None
            ms = bench_ms(lambda: call(), args.warmup, args.rep)
            t = tflops(flops, ms)
            e.update({"ms": ms, "tflops": t, "frac_matmul": t / mm if t and mm else None, "compile_s": compile_s,
                      "block_size": list(bs) if isinstance(bs, tuple) else [bs, bs] if mask_mod else None,
                      "finite": finite, "rel_err": rel if rel is None or math.isfinite(rel) else None})
            e["check"] = ("not finite" if not finite else "not checked" if rel is None
                          else "ok" if rel <= tol else "wrong")
            e["refused"] = None
            if tried:
                e["note"] = "; ".join(tried)
            return e
        except Exception as ex:  # noqa: BLE001  (any failure of one backend is its result, not the run's end)
            why = reason(ex)
            tried.append(f"BLOCK_SIZE={bs}: {why}" if mask_mod is not None else why)
            e["refused"] = "; ".join(tried)
            if "cannot be used" in why or "not available" in why:
                break  # the backend is missing, whatever the block size
        finally:
            bm = out = None  # the block mask and output, freed before a retry or the next backend
            torch.cuda.empty_cache()
    return e


def measure_row(r, mm, args, backends, flash_refusal, softcap, flex):
    """The peers of one engine row, merged into a copy of it."""
    row = dict(r)
    case = r.get("case", "?")
    eng = r.get("tflops") if r.get("status") == "ok" else None
    row["engine_frac_matmul"] = eng / mm if eng and mm else None
    peers = {}
    q = k = v = None
    flops = why = None
    if case_parts(case) is None:
        why = f"case {case!r} is not known to peers_variants.py"
    elif r.get("dtype") not in DTYPES:
        why = f"dtype {r.get('dtype')!r} is not known to peers_variants.py"
    else:
        try:
            B, H, L, D = (int(r[x]) for x in ("B", "H", "L", "D"))
            row["pairs_here"] = pairs_here(case, r)
            if r.get("pairs") is None:  # the engine's count is the one used; this one only where it has none
                print(f"warning: {case} L={L}: no pairs in the engine row, counted here", flush=True)
            elif row["pairs_here"] is not None and row["pairs_here"] != round(float(r["pairs"])):
                print(f"warning: {case} L={L}: the rules here attend {row['pairs_here']} pairs, the engine "
                      f"counted {r['pairs']}", flush=True)
            pairs = float(r["pairs"]) if r.get("pairs") is not None else float(row["pairs_here"])
            flops = 4.0 * D * pairs * B * H
            row["flops"] = flops
            score_mod, mask_mod = make_mods(case, r, softcap)
            dt = DTYPES[r["dtype"]]
            q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dt) for _ in range(3))
            n = min(args.check_rows, L)
            check_rows = torch.linspace(0, L - 1, n, device="cuda").round().long() if n > 0 else None
        except Exception as ex:  # noqa: BLE001  (out of memory, bad row)
            why = reason(ex)
    for name in backends:
        if why:
            peers[name] = {"ms": None, "tflops": None, "frac_matmul": None, "refused": why, "ratio": None}
        else:
            peers[name] = measure_backend(name, flex, q, k, v, score_mod, mask_mod, flops, mm, args, check_rows,
                                          TOLERANCE.get(r["dtype"], 2e-2), flash_refusal)
        t = peers[name]["tflops"]
        peers[name]["ratio"] = eng / t if eng and t else None
        row[f"ratio_vs_{name}"] = peers[name]["ratio"]
    row["peers"] = peers
    # the fastest backend whose output passed its check (or was not checked)
    best = max((n for n in peers if peers[n]["tflops"] and peers[n].get("check") in (None, "ok", "not checked")),
               key=lambda n: peers[n]["tflops"], default=None)
    row["best_peer"] = best
    row["ratio_vs_best"] = eng / peers[best]["tflops"] if eng and best else None
    del q, k, v  # the inputs, before the next case's
    torch.cuda.empty_cache()
    return row


def clean(x):
    """JSON has no NaN / Infinity: such floats become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {kk: clean(vv) for kk, vv in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(vv) for vv in x]
    return x


def main():
    ap = argparse.ArgumentParser(
        description="PyTorch FlexAttention peers (torch.compile'd Triton kernels, and the FLASH CuTe backend where "
                    "this PyTorch has it) of scripts/bench_variants.lua, on its cases in one run on this GPU.",
        epilog="Usage: python3 scripts/peers_variants.py --engine E.json --json OUT.json [--commit C]. "
               "See the module docstring for the cases, rules, timing and output fields.")
    ap.add_argument("--engine", required=True, help="the JSON of bench_variants.lua --json")
    ap.add_argument("--json", required=True, help="the merged result file")
    ap.add_argument("--commit", default=None, help="commit measured (default: the engine JSON's)")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help=f"comma list of peer backends (default: {','.join(BACKENDS)})")
    ap.add_argument("--cases", default=None, help="comma list of case names (default: every row of the engine's)")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms (default 25)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetitions, ms (default 100)")
    ap.add_argument("--check-rows", type=int, default=256,
                    help="query rows of batch 0 checked against a float32 reference (0: no check; default 256)")
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        ap.error(f"unknown backend(s) {','.join(unknown)}; known: {','.join(BACKENDS)}")
    wanted = set(args.cases.split(",")) if args.cases else None
    with open(args.engine) as f:
        engine = json.load(f)
    load()
    emeta = engine.get("meta", {})
    seed = emeta.get("seed") if isinstance(emeta.get("seed"), int) else 1
    torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    softcap = float(emeta.get("softcap") or 30)
    flash_refusal = flash_support() if "flex_flash" in backends else None
    # static shapes: each (case, L) compiles its own kernel with W, prefix and the
    # cap as constants (the FLASH backend cannot take captured symbolic scalars)
    flex = torch.compile(flex_attention, dynamic=False)

    from peer_matmul import MATMUL_N, matmul_tflops  # here: it imports torch
    mm, mm_ms = matmul_tflops(args.warmup, args.rep)
    print(f"bf16 matmul {MATMUL_N}^3: {mm:.0f} TFLOP/s ({mm_ms:.3f} ms)", flush=True)
    warm_s = warm_compiler(flex)
    print(f"compiler warm-up (flex_attention, L = 256, no mods): {warm_s:.1f} s", flush=True)
    if flash_refusal:
        print(f"flex_flash: {flash_refusal}", flush=True)
    rows = []
    for r in engine.get("results", []):
        if wanted and r.get("case") not in wanted:
            continue
        t0 = time.perf_counter()
        rows.append(measure_row(r, mm, args, backends, flash_refusal, softcap, flex))
        print(f"measured {r.get('case')} B={r.get('B')} L={r.get('L')} ({time.perf_counter() - t0:.0f} s)", flush=True)

    result = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "flash_attn": flash_attn_version(),
            "commit": args.commit or emeta.get("commit", "unknown"), "seed": seed,
            "matmul_bf16_tflops": mm, "matmul_bf16_ms": mm_ms, "matmul_n": MATMUL_N,
            "backends": backends, "flex_flash_refused": flash_refusal, "compiler_warmup_s": warm_s,
            "warmup_ms": args.warmup, "rep_ms": args.rep, "check_rows": args.check_rows,
            "softcap": softcap, "slopes": "2^(-8(h+1)/H), h 0-based (the engine's 2^(-8h/H), h 1-based)",
            "benchmark": "attention forward with Lua variants against FlexAttention: TFLOP/s = 4 D pairs B H / median "
                         "time (pairs: attended (q, kv) pairs of one batch-head, the engine's); peers: "
                         "torch.compile(flex_attention, dynamic=False), block mask built outside the timing "
                         "(BLOCK_SIZE 128), timed with triton.testing.do_bench (L2 flushed, median); flex_flash = "
                         "kernel_options BACKEND FLASH; ratio = engine TFLOP/s / peer TFLOP/s, ratio_vs_best "
                         "against the fastest peer; frac_matmul = TFLOP/s / the bf16 8192^3 matmul rate of the "
                         "same run; rel_err on a slice against a float32 reference of the same rules",
            "engine_meta": emeta,
        },
        "rows": rows,
        "host": engine.get("host"),
    }
    with open(args.json, "w") as f:
        json.dump(clean(result), f, indent=1)

    def num(x, w, f=".1f"):
        return f"{x:{w}{f}}" if isinstance(x, (int, float)) and math.isfinite(x) else " " * (w - 3) + "n/a"

    print(f"\nforward TFLOP/s over the attended pairs; bf16 matmul {mm:.0f} TFLOP/s on {result['meta']['gpu']}, "
          f"torch {torch.__version__}")
    head = f"{'case':17} {'L':>6} {'B':>2} {'dens':>5} {'ms':>8} {'engine':>7}"
    for name in backends:
        head += f" {name + ' ms':>14} {'TFLOP/s':>7} {'comp s':>6}"
    head += " " + " ".join(f"{'x' + name:>12}" for name in backends) + f" {'xbest':>6} {'eng/mm':>6}"
    print(head)
    for r in rows:
        p = r["peers"]
        line = (f"{str(r.get('case')):17} {r.get('L', 0):6} {r.get('B', 0):2} {num(r.get('density'), 5, '.2f')} "
                f"{num(r.get('ms'), 8, '.3f')} {num(r.get('tflops'), 7)}")
        for name in backends:
            line += f" {num(p[name]['ms'], 14, '.3f')} {num(p[name]['tflops'], 7)} {num(p[name].get('compile_s'), 6)}"
        line += " " + " ".join(num(p[name]["ratio"], 12, ".2f") for name in backends)
        line += f" {num(r.get('ratio_vs_best'), 6, '.2f')} {num(r.get('engine_frac_matmul'), 6, '.2f')}"
        if r.get("status", "ok") != "ok":
            line += f"  engine {r.get('status')}: {r.get('error', r.get('rel_err', ''))}"
        print(line)
    for r in rows:
        for name, p in r["peers"].items():
            where = f"{name} on {r.get('case')} L={r.get('L')}"
            if p.get("refused"):
                print(f"refused: {where}: {p['refused']}")
            elif p.get("check") not in (None, "ok"):
                print(f"check {p['check']}: {where}: rel_err {p.get('rel_err')}")
            if p.get("note"):
                print(f"note: {where} ran at BLOCK_SIZE {p.get('block_size')} after: {p['note']}")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
