"""The outside oracle for fa.attention on the GPU (issue 21; docs/reliability.md
says how it fits the GPU run).

A seeded random grid in the style of FlashAttention's own tests: each case
draws its shapes (Lq >> Lk, Lq << Lk, equal, odd and prime lengths, Lq = 1;
head dims 32 to 256, odd ones too; MHA, GQA, MQA), dtype (f16, bf16, f32),
layout (API §6, read and written where they lie: contiguous (B, H, L, D);
"blhd", transposed views of the host's (B, L, H, D) tensors, the output
too; "packed", q from a (B, L, H, D) tensor and k, v sliced from one packed
(B, L, 2, H, D) tensor, the lse a slice of a wider buffer; "padded", rows
8 or 1 elements wider than D, which the tensor cores' 16-byte copies
cannot take at 1) and score rule (causal in both alignments, window, softcap, alibi,
bool and float masks of several broadcast shapes, kv_lens, scale; and their
combinations), makes q, k, v with torch on the GPU and hands the very same
memory to the engine through its C API (ctypes, fa_tensor_wrap over the
device pointers and strides: zero copy, on torch's stream).

Judged with FlashAttention's criterion: max |out - ref32| <= 2 max |out_lp -
ref32| + 1e-5, where ref32 is PyTorch computing the same function in f32 on
the upcast inputs and out_lp the same math done by PyTorch in the inputs'
dtype; for f32 inputs, max |out - ref64| <= 1e-5 max |ref64| (relative),
ref64 in f64, or within twice PyTorch's own f32 error where that is larger
(scale = 1 at D = 256, or alibi biases in the thousands, round the f32
scores past 1e-5 in any f32 implementation).  lse is judged the same way (f32 in every case), rows with no
key must be exact zeros with lse = -inf.  Every case is run twice into
NaN-poisoned outputs: the two results must be bit-identical (a race shows
up there first).

A failing case prints its seed and parameters; `--case N` (with the same
--seed) replays it alone.

Usage (on the GPU machine, after scripts/gpu_env.sh and a build):
  python3 scripts/oracle_attention.py --lib build-gpu/libflashattn.so [--cases 600] [--seed 1]
      [--filter lq_gg_lk] [--max-elems N] [--json OUT.json] [--commit C] [--case N]
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fa_ctypes import ALGOS, CAUSAL, FA_CPU, FA_CUDA, FA_DTYPES, AttnOpts, check_opts_mirror  # noqa: F401

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


class Engine:
    """The C API through ctypes (libflashattn holds no Lua)."""

    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        check_opts_mirror(self.lib)
        L = self.lib
        vp, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
        L.fa_context_create.argtypes = [ctypes.c_int, ctypes.POINTER(vp)]
        L.fa_context_set_stream.argtypes = [vp, vp]
        L.fa_context_error.argtypes = [vp]
        L.fa_context_error.restype = ctypes.c_char_p
        L.fa_sync.argtypes = [vp]
        L.fa_tensor_wrap.argtypes = [vp, vp, ctypes.c_int, ctypes.c_int, ctypes.c_int, i64p, i64p, vp, vp,
                                     ctypes.POINTER(vp)]
        L.fa_tensor_release.argtypes = [vp]
        L.fa_tensor_release.restype = None
        L.fa_attention_opts_init.argtypes = [ctypes.POINTER(AttnOpts)]
        L.fa_attention_opts_init.restype = None
        L.fa_attention.argtypes = [vp, vp, vp, vp, ctypes.POINTER(AttnOpts), ctypes.POINTER(vp), ctypes.POINTER(vp)]
        L.fa_context_destroy.argtypes = [vp]
        L.fa_context_destroy.restype = None
        self.ctx = vp()
        self.check(L.fa_context_create(FA_CUDA, ctypes.byref(self.ctx)), "fa_context_create")
        self.check(L.fa_context_set_stream(self.ctx, torch.cuda.current_stream().cuda_stream), "set_stream")

    def close(self):
        """Destroys the context (its cuBLAS handle, events and streams) while
        the CUDA runtime is still up."""
        if self.ctx:
            self.lib.fa_sync(self.ctx)
            self.lib.fa_context_destroy(self.ctx)
            self.ctx = None

    def check(self, st, what):
        if st:
            msg = self.lib.fa_context_error(self.ctx) if self.ctx else b""
            raise RuntimeError(f"{what}: status {st}: {msg.decode() if msg else ''}")

    def wrap(self, t, dtype_name):
        """An fa_tensor over torch tensor t's memory (no copy): the caller
        releases it; t must outlive it."""
        nd = t.dim()
        shape = (ctypes.c_int64 * nd)(*t.shape)
        strides = (ctypes.c_int64 * nd)(*t.stride())
        out = ctypes.c_void_p()
        self.check(self.lib.fa_tensor_wrap(self.ctx, ctypes.c_void_p(t.data_ptr()), FA_CUDA, FA_DTYPES[dtype_name],
                                           nd, shape, strides, None, None, ctypes.byref(out)), "fa_tensor_wrap")
        return out

    def attention(self, q, k, v, c, mask, out, lse):
        """fa_attention on case c, into the torch tensors out and lse."""
        held = []
        try:
            tq, tk, tv = self.wrap(q, c["dtype"]), self.wrap(k, c["dtype"]), self.wrap(v, c["dtype"])
            held += [tq, tk, tv]
            o = AttnOpts()
            self.lib.fa_attention_opts_init(ctypes.byref(o))
            o.algo = ALGOS[c["algo"]]
            if c["scale"] is not None:
                o.has_scale, o.scale = 1, c["scale"]
            o.causal = CAUSAL[c["causal"]]
            if c["window"] is not None:
                o.has_window, o.window_left, o.window_right = 1, c["window"][0], c["window"][1]
            if mask is not None:
                tm = self.wrap(mask, "bool" if mask.dtype == torch.bool else
                               {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[mask.dtype])
                held.append(tm)
                o.mask = tm
            kv = alibi = None
            if c["kv_lens"] is not None:
                kv = (ctypes.c_int64 * len(c["kv_lens"]))(*c["kv_lens"])
                o.kv_lens, o.n_kv_lens = ctypes.cast(kv, ctypes.POINTER(ctypes.c_int64)), len(c["kv_lens"])
            if c["alibi"] is not None:
                alibi = (ctypes.c_double * len(c["alibi"]))(*c["alibi"])
                o.alibi, o.n_alibi = ctypes.cast(alibi, ctypes.POINTER(ctypes.c_double)), len(c["alibi"])
            if c["softcap"] is not None:
                o.softcap = c["softcap"]
            if c["tile"] is not None:
                o.tile_q, o.tile_k = c["tile"]
            o.return_lse = 1
            to, tl = self.wrap(out, c["dtype"]), self.wrap(lse, "f32")
            held += [to, tl]
            o.out, o.lse_out = to, tl
            ro, rl = ctypes.c_void_p(), ctypes.c_void_p()
            self.check(self.lib.fa_attention(self.ctx, tq, tk, tv, ctypes.byref(o), ctypes.byref(ro), ctypes.byref(rl)),
                       "fa_attention")
            held += [ro, rl]  # the same tensors as out / lse, retained once more for the caller
            self.check(self.lib.fa_sync(self.ctx), "fa_sync")
        finally:
            for t in held:
                if t:
                    self.lib.fa_tensor_release(t)


# ---- the grid -----------------------------------------------------------------------------------
LENGTH_PAIRS = [  # (Lq, Lk): Lq >> Lk, Lq << Lk, equal, odd and prime, Lq = 1
    (2048, 64), (799, 3), (1000, 1), (4096, 128), (1536, 384), (509, 127), (2047, 129), (777, 65),
    (64, 2048), (3, 799), (1, 512), (1, 37), (1, 1), (17, 1031), (128, 4096), (113, 1023),
    (128, 128), (257, 257), (97, 97), (1024, 1024), (2, 2), (331, 331), (512, 512), (61, 67),
]
HEAD_DIMS = [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256]
HEADS = [(1, 1), (4, 4), (3, 3), (8, 2), (9, 3), (6, 2), (8, 1), (4, 1)]  # (Hq, Hkv): MHA, GQA, MQA
TILES = [(64, 64), (128, 64), (32, 32), (16, 48), (1, 8), (37, 29), (128, 128), (64, 128)]
# tiles that fit in shared memory at every head dim up to 256 (f32 included)
TILES_WIDE = [(32, 32), (16, 48), (1, 8), (37, 29), (64, 32), (128, 16)]


def draw_case(idx, seed, max_elems):
    """Case idx of the grid seeded by seed (a pure function of both)."""
    r = random.Random(seed * 1000003 + idx)
    c = {"idx": idx, "seed": seed}
    c["dtype"] = r.choice(["f16", "bf16", "bf16", "f16", "f32"])
    c["Lq"], c["Lk"] = r.choice(LENGTH_PAIRS)
    c["D"] = r.choice(HEAD_DIMS)
    c["Dv"] = c["D"] if r.random() < 0.85 else r.choice(HEAD_DIMS)
    c["Hq"], c["Hkv"] = r.choice(HEADS)
    c["B"] = r.choice([1, 2, 3, 4])
    while c["B"] > 1 and c["B"] * c["Hq"] * c["Lq"] * c["Lk"] > max_elems:
        c["B"] -= 1
    if c["B"] * c["Hq"] * c["Lq"] * c["Lk"] > max_elems:
        c["Hq"], c["Hkv"] = r.choice([(1, 1), (2, 1), (2, 2)])
    c["layout"] = r.choice(["bhld", "bhld", "blhd", "packed", "padded"])
    c["pad"] = r.choice([8, 8, 1])
    c["causal"] = r.choice(["none", "none", "bottom_right", "bottom_right", "top_left"])
    c["window"] = None
    if r.random() < 0.2:
        c["window"] = (r.choice([-1, 0, 1, 7, 64, 300]), r.choice([-1, 0, 3, 64, 200]))
    c["softcap"] = r.choice([5.0, 30.0, 0.5]) if r.random() < 0.15 else None
    c["alibi"] = [2.0 ** (-8.0 * (h + 1) / c["Hq"]) * r.choice([1, 0.5]) for h in range(c["Hq"])] if r.random() < 0.15 else None
    c["mask"] = None
    if r.random() < 0.2:
        c["mask"] = (r.choice(["bool", "float"]), r.choice(["11qk", "b1qk", "bhqk", "1hqk"]))
    c["kv_lens"] = [r.randint(0, c["Lk"]) for _ in range(c["B"])] if r.random() < 0.15 else None
    c["scale"] = r.choice([None, None, None, 1.0, 0.05, -0.3]) if r.random() < 0.3 else None
    c["algo"] = r.choice(["auto"] * 6 + ["flash", "flash", "two_pass", "naive", "flash_row"])
    tiles = TILES if max(c["D"], c["Dv"]) <= 128 else TILES_WIDE
    c["tile"] = r.choice(tiles) if c["algo"] in ("flash", "two_pass") and r.random() < 0.6 else None
    return c


def forced_cases(seed):
    """Issue 21's reproducers, always in the grid: the causal Lq >> Lk race."""
    base = {"seed": seed, "Dv": None, "layout": "bhld", "pad": 8, "window": None, "softcap": None, "alibi": None,
            "mask": None, "kv_lens": None, "scale": None, "algo": "auto", "tile": None}
    out = []
    for dt in ("f16", "bf16"):
        out.append(dict(base, dtype=dt, B=4, Hq=8, Hkv=8, Lq=2048, Lk=64, D=128, causal="bottom_right"))
        for D in (64, 128, 256):
            out.append(dict(base, dtype=dt, B=4, Hq=9, Hkv=3, Lq=799, Lk=3, D=D, causal="bottom_right"))
    for i, c in enumerate(out):
        c["idx"], c["Dv"] = -1 - i, c["D"]
    return out


def describe(c):
    return " ".join(f"{k}={c[k]}" for k in ("idx", "seed", "dtype", "B", "Hq", "Hkv", "Lq", "Lk", "D", "Dv", "layout",
                                              "causal", "window", "softcap", "mask", "kv_lens", "scale", "algo", "tile")) + \
        (" alibi=yes" if c["alibi"] else "")


# ---- inputs and the reference ---------------------------------------------------------------------
def make_inputs(c):
    g = torch.Generator(device="cuda")
    g.manual_seed(c["seed"] * 7919 + c["idx"] + 1000)
    dt = TORCH_DTYPES[c["dtype"]]

    def tensor(H, L, D):
        if c["layout"] in ("blhd", "packed"):  # the host's (B, L, H, D), seen as (B, H, L, D)
            return torch.randn(c["B"], L, H, D, device="cuda", generator=g).to(dt).transpose(1, 2)
        if c["layout"] == "padded":  # rows pad elements wider than D
            return torch.randn(c["B"], H, L, D + c["pad"], device="cuda", generator=g).to(dt)[..., :D]
        return torch.randn(c["B"], H, L, D, device="cuda", generator=g).to(dt)

    q = tensor(c["Hq"], c["Lq"], c["D"])
    if c["layout"] == "packed" and c["D"] == c["Dv"]:  # k and v: slices of one (B, L, 2, H, D) tensor
        kv = torch.randn(c["B"], c["Lk"], 2, c["Hkv"], c["D"], device="cuda", generator=g).to(dt)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    else:
        k, v = tensor(c["Hkv"], c["Lk"], c["D"]), tensor(c["Hkv"], c["Lk"], c["Dv"])
    mask = None
    if c["mask"] is not None:
        kind, form = c["mask"]
        shape = [c["B"] if form[0] == "b" else 1, c["Hq"] if form[1] == "h" else 1, c["Lq"], c["Lk"]]
        if kind == "bool":
            mask = torch.rand(shape, device="cuda", generator=g) < 0.8
        else:
            mask = (torch.randn(shape, device="cuda", generator=g) * 2).to(dt if c["dtype"] != "f32" else torch.float32)
            mask = mask.masked_fill(torch.rand(shape, device="cuda", generator=g) < 0.1, float("-inf"))
    return q, k, v, mask


def keep_mask(c):
    """The keys each query row may attend: causal, window, kv_lens (B, 1, Lq, Lk)."""
    Lq, Lk = c["Lq"], c["Lk"]
    i = torch.arange(Lq, device="cuda").view(Lq, 1)
    j = torch.arange(Lk, device="cuda").view(1, Lk)
    diag = i + Lk - Lq
    keep = torch.ones(Lq, Lk, dtype=torch.bool, device="cuda")
    if c["causal"] == "bottom_right":
        keep &= j <= diag
    elif c["causal"] == "top_left":
        keep &= j <= i
    if c["window"] is not None:
        left, right = c["window"]
        if left >= 0:
            keep &= j >= diag - left
        if right >= 0:
            keep &= j <= diag + right
    keep = keep.view(1, 1, Lq, Lk).expand(c["B"], 1, Lq, Lk)
    if c["kv_lens"] is not None:
        lens = torch.tensor(c["kv_lens"], device="cuda").view(c["B"], 1, 1, 1)
        keep = keep & (j.view(1, 1, 1, Lk) < lens)
    return keep


def reference(c, q, k, v, mask, dt):
    """(o, lse) of the contract's function computed by PyTorch with every
    operation in dtype dt (lse in f32 or f64)."""
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    rep = c["Hq"] // c["Hkv"]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(c["D"])
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if c["softcap"] is not None:
        s = torch.tanh(s / c["softcap"]) * c["softcap"]
    Lq, Lk = c["Lq"], c["Lk"]
    if c["alibi"] is not None:
        i = torch.arange(Lq, device="cuda").view(Lq, 1)
        j = torch.arange(Lk, device="cuda").view(1, Lk)
        dist = (i + Lk - Lq - j).abs().to(dt)
        slopes = torch.tensor(c["alibi"], device="cuda", dtype=dt).view(1, c["Hq"], 1, 1)
        s = s - slopes * dist
    keep = keep_mask(c)
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            s = s + mask.to(dt)
    s = s.masked_fill(~keep, float("-inf"))
    acc = torch.float64 if dt == torch.float64 else torch.float32
    lse = torch.logsumexp(s.to(acc), dim=-1)
    empty = torch.isinf(lse) & (lse < 0)
    p = torch.softmax(s, dim=-1)
    p = p.masked_fill(empty.unsqueeze(-1), 0.0)
    o = torch.matmul(p, v)
    return o, lse, empty


def judge(c, out, lse, q, k, v, mask):
    """(ok, message) for one case's engine output."""
    if c["dtype"] == "f32":  # ref64 as the exact value, PyTorch's f32 as the low-precision peer
        ref, ref_lse, empty = reference(c, q, k, v, mask, torch.float64)
        lp, lp_lse, _ = reference(c, q, k, v, mask, torch.float32)
        err = (out.double() - ref).abs().max().item() if out.numel() else 0.0
        err_lp = (lp.double() - ref).abs().max().item() if out.numel() else 0.0
        scale = ref.abs().max().item() if ref.numel() else 0.0
        limit = max(1e-5 * scale, 2 * err_lp)
        ok = err <= limit
        msg = f"out err {err:.3g} (rel {err / max(scale, 1e-30):.3g}), torch f32 err {err_lp:.3g} (limit {limit:.3g})"
        finite = ~empty
        lerr = (lse.double() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
        lerr_lp = (lp_lse.double() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
        lscale = max(ref_lse[finite].abs().max().item() if finite.any() else 0.0, 1.0)
        lok = lerr <= max(1e-5 * lscale, 2 * lerr_lp)
    else:
        ref, ref_lse, empty = reference(c, q, k, v, mask, torch.float32)
        lp, lp_lse, _ = reference(c, q, k, v, mask, TORCH_DTYPES[c["dtype"]])
        err = (out.float() - ref).abs().max().item() if out.numel() else 0.0
        err_lp = (lp.float() - ref).abs().max().item() if out.numel() else 0.0
        ok = err <= 2 * err_lp + 1e-5
        msg = f"out err {err:.3g}, torch {c['dtype']} err {err_lp:.3g} (limit {2 * err_lp + 1e-5:.3g})"
        finite = ~empty
        lerr = (lse - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
        lerr_lp = (lp_lse.float() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
        lok = lerr <= 2 * lerr_lp + 1e-4
    msg += f"; lse err {lerr:.3g}"
    if not torch.isfinite(out).all():
        ok, msg = False, msg + "; NaN/inf in out"
    rows_zero = (out[empty] == 0).all().item() if empty.any() else True
    lse_ninf = (lse[empty] == float("-inf")).all().item() if empty.any() else True
    if not (rows_zero and lse_ninf):
        ok, msg = False, msg + "; a row with no key is not zeros with lse = -inf"
    return ok and lok, msg


def bits(t):
    """t's elements as integers of their width (NaN compares equal to itself)."""
    return t.contiguous().view(-1).view(torch.int32 if t.element_size() == 4 else torch.int16)


def make_outputs(c):
    """NaN-poisoned out (B, Hq, Lq, Dv) and lse (B, Hq, Lq) in the case's
    layout (views the engine writes through), and the whole buffers."""
    dt, (B, H, L, Dv) = TORCH_DTYPES[c["dtype"]], (c["B"], c["Hq"], c["Lq"], c["Dv"])
    nan = float("nan")
    if c["layout"] in ("blhd", "packed"):
        ob = torch.full((B, L, H, Dv), nan, device="cuda", dtype=dt)
        out = ob.transpose(1, 2)
    elif c["layout"] == "padded":
        ob = torch.full((B, H, L, Dv + c["pad"]), nan, device="cuda", dtype=dt)
        out = ob[..., :Dv]
    else:
        ob = out = torch.full((B, H, L, Dv), nan, device="cuda", dtype=dt)
    if c["layout"] == "packed":
        lb = torch.full((B, H, L + 3), nan, device="cuda", dtype=torch.float32)
        lse = lb[..., 1:L + 1]
    else:
        lb = lse = torch.full((B, H, L), nan, device="cuda", dtype=torch.float32)
    return out, lse, ob, lb


def untouched(whole, view):
    """Whether every element of buffer `whole` outside `view` is still NaN."""
    mark = torch.zeros(whole.shape, dtype=torch.bool, device="cuda")
    mark.as_strided(view.shape, view.stride(), view.storage_offset() - whole.storage_offset()).fill_(True)
    return bool(torch.isnan(whole[~mark].float()).all().item())


def run_case(eng, c):
    """(ok, deterministic, message)."""
    q, k, v, mask = make_inputs(c)
    outs = []
    for _ in range(2):
        out, lse, ob, lb = make_outputs(c)
        eng.attention(q, k, v, c, mask, out, lse)
        if not (untouched(ob, out) and untouched(lb, lse)):
            return False, True, "a write outside the output views"
        outs.append((out, lse))
    (o1, l1), (o2, l2) = outs
    same = torch.equal(bits(o1), bits(o2)) and torch.equal(bits(l1), bits(l2))
    ok, msg = judge(c, o1, l1, q, k, v, mask)
    return ok, same, msg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build-gpu/libflashattn.so")
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--case", type=int, default=None, help="replay this case of the grid alone")
    ap.add_argument("--filter", choices=["all", "lq_gg_lk"], default="all",
                    help="lq_gg_lk: only cases with Lq >= 4 Lk (the sanitizer passes)")
    ap.add_argument("--max-elems", type=int, default=24 << 20, help="bound on B*Hq*Lq*Lk of a case")
    ap.add_argument("--json", default=None)
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    eng = Engine(a.lib)
    if a.case is not None:
        cases = [c for c in forced_cases(a.seed) if c["idx"] == a.case] or [draw_case(a.case, a.seed, a.max_elems)]
    else:
        cases = forced_cases(a.seed) + [draw_case(i, a.seed, a.max_elems) for i in range(a.cases)]
    if a.filter == "lq_gg_lk":
        cases = [c for c in cases if c["Lq"] >= 4 * c["Lk"]]
    t0 = time.time()
    fails, nondet, errors, counts = [], [], [], {}
    for c in cases:
        for key in ("dtype", "algo", "causal", "layout"):
            counts.setdefault(key, {}).setdefault(str(c[key]), 0)
            counts[key][str(c[key])] += 1
        try:
            ok, same, msg = run_case(eng, c)
        except RuntimeError as e:  # an engine error on a valid call is a failure too
            ok, same, msg = False, True, f"engine error: {e}"
            errors.append(c["idx"])
        if not ok:
            fails.append({"case": describe(c), "why": msg})
            print(f"FAIL {describe(c)}: {msg}", flush=True)
        if not same:
            nondet.append(describe(c))
            print(f"NONDETERMINISTIC {describe(c)}", flush=True)
    secs = time.time() - t0
    eng.close()
    line = (f"oracle: {len(cases)} cases, {len(fails)} failures, {len(nondet)} not bit-identical when run twice "
            f"({secs:.0f} s, seed {a.seed}, filter {a.filter})")
    print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "commit": a.commit, "seed": a.seed, "filter": a.filter,
                       "command": " ".join(sys.argv), "cases": len(cases), "failures": len(fails),
                       "nondeterministic": len(nondet), "seconds": round(secs, 1), "counts": counts,
                       "failed": fails, "not_bit_identical": nondet,
                       "criterion": "f16/bf16: max|out-ref32| <= 2 max|out_lp-ref32| + 1e-5 (lse: + 1e-4); "
                                    "f32: max|out-ref64| <= max(1e-5 max|ref64|, 2 max|out_torch_f32-ref64|); "
                                    "empty rows exact zeros, lse -inf"},
                      f, indent=1)
    sys.exit(1 if fails or nondet else 0)


if __name__ == "__main__":
    main()
