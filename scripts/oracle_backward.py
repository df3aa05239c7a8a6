"""The outside oracle for fa_attention_backward on the GPU (issue 27: the
backward "against PyTorch autograd ... in the GPU run's oracle grid").

A seeded random grid: each case draws a dtype (f16, bf16, f32), B 1 to 3,
GQA groups Hq / Hkv of 1, 2 and 4 over 1 to 4 KV heads, lengths Lq and Lk
from 1 to about 600 (Lq >> Lk, Lq << Lk, equal, tiny, multiples of 64 and
not), head dims D = Dv = 64 or 128 mostly (f16/bf16 there take the
tensor-core kernels when the rows lie on 16 bytes) and 32, 40, 80, 96, 256
and D != Dv (the SIMT kernel), a layout (contiguous (B, H, L, D);
"blhd", transposed views of (B, L, H, D) tensors; "packed", q (B, L, H, D)
and k, v slices of one (B, L, 2, H, D) tensor; "qkv", q, k and v narrowed
from one (B, L, Hq + 2 Hkv, D) tensor, as a fused QKV projection leaves
them; "padded", rows 8 or 1 elements wider than D, which the 16-byte
copies cannot take at 1) and a score rule (causal in both alignments,
window, kv_lens, alibi, softcap, bool and float masks of several broadcast
shapes, scale, and their combinations).  q, k, v and dout are made by torch
on the GPU and handed to the engine where they lie (ctypes over the device
pointers, scripts/oracle_attention.py's Engine: zero copy, on torch's
stream); o and lse come from the engine's own forward (fa_attention into
torch buffers of the case's layout), then fa_attention_backward gives dq,
dk, dv: new engine tensors, checked for shape, dtype (q's) and device,
copied into torch tensors (fa_tensor_copy) and released.

The reference: the same function written out in PyTorch (scores = scale q
k^T; softcap c tanh(s / c); alibi s - slope[h] |i + Lk - Lq - j|; the float
mask added; keys outside causal / window / kv_lens and where the bool mask is
false at -inf; query head h reads KV head h // (Hq / Hkv); a row with no key
gives zeros), differentiated by autograd in f64 on the upcast inputs (the
exact value), and the same in the inputs' dtype (f32 for f32 inputs:
PyTorch's own error).  Judged per gradient with FlashAttention's criterion:
max |g - ref64| <= 2 max |g_torch_lowp - ref64| + floor, floor = 1e-3
(f16/bf16) or 1e-5 (f32) times the largest |ref64| of the case's three
gradients, plus max |g_oround - ref64|: the gradient FlashAttention's method
gives in exact arithmetic when o is stored in the inputs' dtype (its D_i =
rowsum(dout * o) comes from that o; the math path's autograd never uses o,
so torch's error does not hold this term, which dominates on rows of a few
keys).  For dq and dk the low-precision error is the larger of the math
path's and that of FlashAttention's method in f32 (fa_form_grads: D_i from
o rather than from P and dP, which on rows of one key leaves the rounding of
two dot products where the math path gives exactly 0).  And exactly: no NaN
or inf in a gradient; dq exactly 0 on the rows with no key, dk and dv exactly 0 on the keys no query row of their
group takes; the inputs (q, k, v, o, lse, dout, mask) unchanged; every
backward run twice and bit-identical (dq only in the cases that set
opts.deterministic, half of them: else the wgmma kernel sums dq with atomics), the
engine's memory pool poisoned with NaN in the gradients' shapes before each
run (best effort: an element a kernel leaves unwritten shows as NaN).
Informational: where SDPA can express the case (all but softcap; no row
without a key), PyTorch SDPA's own autograd in f32 on the upcast inputs
against the same reference (its error per gradient beside the engine's).

A failure prints a line starting FAIL (or NONDET) with the case; `--case N`
(same --seed) replays it; `--list` prints the grid without a GPU.

Usage (on the GPU machine, after scripts/gpu_env.sh and a build):
  python3 scripts/oracle_backward.py --lib build-gpu/libflashattn.so [--cases 300] [--seed 1]
      [--max-elems N] [--json OUT.json] [--commit C] [--case N] [--verbose]
  python3 scripts/oracle_backward.py --list --cases 50
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# torch and scripts/oracle_attention.py (which imports torch) are loaded in main,
# so that --help and --list run where there is no torch
torch = None
oa = None

NAMES = {"f32": "f32", "f16": "f16", "bf16": "bf16"}
REL_FLOOR = {"f16": 1e-3, "bf16": 1e-3, "f32": 1e-5}
HEAD_DIMS_OTHER = [32, 40, 80, 96, 256]
DV_OTHER = [32, 64, 96, 128]
LAYOUTS = ["bhld"] * 7 + ["blhd"] * 5 + ["packed"] * 3 + ["qkv"] * 3 + ["padded"] * 2


def load_torch():
    global torch, oa
    import torch as _torch
    import oracle_attention as _oa
    torch, oa = _torch, _oa


# ---- the grid (pure Python: no torch) -----------------------------------------------------------
def draw_lengths(r):
    """(Lq, Lk): Lq >> Lk, Lq << Lk, equal, tiny, and anything up to 600,
    multiples of 64 and not."""
    u = r.random()

    def any_len():
        return r.randint(1, 9) * 64 if r.random() < 0.3 else r.randint(1, 600)

    if u < 0.15:
        return r.randint(200, 600), r.randint(1, 40)
    if u < 0.30:
        return r.randint(1, 40), r.randint(200, 600)
    if u < 0.45:
        L = any_len()
        return L, L
    if u < 0.55:
        return r.randint(1, 17), r.randint(1, 17)
    return any_len(), any_len()


def base_case(idx, seed):
    return {"idx": idx, "seed": seed, "algo": "auto", "tile": None, "splits": 0, "pad": 8, "window": None,
            "softcap": None, "alibi": None, "mask": None, "kv_lens": None, "scale": None, "causal": "none",
            "lse_dtype": "f32"}


def shrink(c, max_elems):
    """B, then Hkv, then the group, then the longer length down until
    B * Hq * Lq * Lk <= max_elems (qkv keeps Lq = Lk)."""
    def size():
        return c["B"] * c["Hq"] * c["Lq"] * c["Lk"]

    while size() > max_elems:
        G = c["Hq"] // c["Hkv"]
        if c["B"] > 1:
            c["B"] -= 1
        elif c["Hkv"] > 1:
            c["Hkv"] -= 1
            c["Hq"] = c["Hkv"] * G
        elif G > 1:
            c["Hq"] //= 2
        elif c["layout"] == "qkv":
            c["Lq"] = c["Lk"] = max(1, c["Lq"] // 2)
        elif c["Lq"] >= c["Lk"]:
            c["Lq"] = max(1, c["Lq"] // 2)
        else:
            c["Lk"] = max(1, c["Lk"] // 2)


def draw_case(idx, seed, max_elems):
    """Case idx of the grid seeded by seed (a pure function of the three)."""
    r = random.Random(f"oracle_backward {seed} {idx}")
    c = base_case(idx, seed)
    c["dtype"] = r.choice(["f16", "bf16", "f16", "bf16", "f32"])
    c["layout"] = r.choice(LAYOUTS)
    c["pad"] = r.choice([8, 8, 1])
    c["Lq"], c["Lk"] = draw_lengths(r)
    if r.random() < 0.75:
        c["D"] = r.choice([64, 128])
        c["Dv"] = c["D"] if r.random() < 0.9 else 192 - c["D"]  # 64 with 128, 128 with 64: the SIMT kernel
    else:
        c["D"] = r.choice(HEAD_DIMS_OTHER)
        c["Dv"] = c["D"] if r.random() < 0.7 else r.choice(DV_OTHER)
    c["Hkv"] = r.choice([1, 2, 3, 4])
    c["Hq"] = c["Hkv"] * r.choice([1, 2, 4])
    c["B"] = r.randint(1, 3)
    if c["layout"] == "qkv":  # one tensor: one length, one head dim
        c["Lk"] = c["Lq"]
        c["Dv"] = c["D"]
    if c["layout"] == "packed" and c["D"] != c["Dv"]:
        c["layout"] = "blhd"
    # the score rule: each option on its own draw, so that they combine
    c["causal"] = r.choice(["none", "none", "none", "bottom_right", "bottom_right", "top_left"])
    if r.random() < 0.15:
        c["window"] = (r.choice([-1, 0, 1, 7, 64, 300]), r.choice([-1, 0, 3, 64, 200]))
    if r.random() < 0.15:
        c["softcap"] = r.choice([5.0, 30.0, 0.5])
    if r.random() < 0.15:
        c["alibi"] = True  # the slopes once Hq is final
    if r.random() < 0.2:
        c["mask"] = (r.choice(["bool", "float"]), r.choice(["11qk", "b1qk", "bhqk", "1hqk"]))
    if r.random() < 0.15:
        c["kv_lens"] = True  # once B and Lk are final
    if r.random() < 0.2:
        c["scale"] = r.choice([1.0, 0.05, -0.3, 0.3])
    if r.random() < 0.1:
        c["lse_dtype"] = "f64"  # lse of any float dtype (converted to f32 by the engine)
    shrink(c, max_elems)
    if c["alibi"]:
        c["alibi"] = [2.0 ** (-8.0 * (h + 1) / c["Hq"]) * r.choice([1, 0.5]) for h in range(c["Hq"])]
    else:
        c["alibi"] = None
    if c["kv_lens"]:
        c["kv_lens"] = [r.choice([0, c["Lk"], r.randint(0, c["Lk"]), max(0, c["Lk"] - r.randint(0, 70))])
                        for _ in range(c["B"])]
    else:
        c["kv_lens"] = None
    c["deterministic"] = r.random() < 0.5  # drawn last: the grid's other draws as before
    return c


def forced_cases(seed):
    """Always in the grid (negative idx): the tensor-core kernels at their
    shapes, MQA, Lq = 1, Lk = 1, the widest head dim, a batch with no key,
    the deterministic walk over several key tiles a block."""
    out = []

    def add(**kw):
        c = base_case(0, seed)
        c.update({"layout": "bhld", "B": 2, "Hq": 4, "Hkv": 4})
        c.update(kw)
        c.setdefault("Dv", c["D"])
        out.append(c)

    add(dtype="f16", Lq=256, Lk=256, D=64)
    add(dtype="bf16", Lq=300, Lk=577, D=128, causal="bottom_right")
    add(dtype="bf16", Lq=384, Lk=384, D=128, Hq=8, Hkv=2, causal="top_left", layout="qkv")
    add(dtype="f16", Lq=1, Lk=600, D=128, Hq=8, Hkv=1)
    add(dtype="f16", Lq=600, Lk=1, D=64, causal="bottom_right")
    add(dtype="bf16", Lq=513, Lk=65, D=64, B=1, causal="bottom_right", layout="blhd")
    add(dtype="f32", Lq=200, Lk=333, D=256, B=1, Hq=2, Hkv=1)
    add(dtype="f16", Lq=128, Lk=200, D=128, B=3, kv_lens=[0, 200, 17])
    add(dtype="bf16", Lq=97, Lk=131, D=64, window=(16, 0), softcap=30.0, layout="padded", pad=1)
    for i, c in enumerate(out):
        c["deterministic"] = i % 2 == 1
    # the deterministic walk of the wgmma backward (D = 128) with several key tiles a block, each adding
    # into its own copy of dq: more KV heads than an H100/H200 has SMs (one block a head, 4 tiles), and
    # 40 KV heads of 8 key tiles (3 blocks a head: the snake's last turn cut short), GQA
    add(dtype="bf16", Lq=512, Lk=512, D=128, Hq=72, Hkv=72, causal="bottom_right", deterministic=True)
    add(dtype="f16", Lq=1024, Lk=1024, D=128, B=1, Hq=80, Hkv=40, deterministic=True)
    for i, c in enumerate(out):
        c["idx"] = -1 - i
    return out


def expected_path(c, strides=None):
    """Which kind of kernel the call should take: "tc", the tensor cores
    (f16/bf16, D = Dv = 64, 96 or 128, every row of q, k, v, o and dout on
    16 bytes: "wgmma" on Hopper, else "mma"), or "simt".  Without strides
    (the --list), from the layout alone."""
    if c["dtype"] == "f32" or c["D"] != c["Dv"] or c["D"] not in (64, 96, 128):
        return "simt"
    if strides is None:
        return "simt" if c["layout"] == "padded" and c["pad"] % 8 else "tc"
    return "tc" if all(x % 8 == 0 for x in strides) else "simt"


def describe(c):
    s = (f"idx={c['idx']} seed={c['seed']} {c['dtype']} B={c['B']} Hq={c['Hq']} Hkv={c['Hkv']} Lq={c['Lq']} "
         f"Lk={c['Lk']} D={c['D']} Dv={c['Dv']} layout={c['layout']}")
    if c["layout"] == "padded":
        s += f"+{c['pad']}"
    if c["causal"] != "none":
        s += f" causal={c['causal']}"
    for key in ("window", "softcap", "mask", "kv_lens", "scale"):
        if c[key] is not None:
            s += f" {key}={c[key]}"
    if c["alibi"]:
        s += " alibi=yes"
    if c["lse_dtype"] != "f32":
        s += f" lse={c['lse_dtype']}"
    if c.get("deterministic"):
        s += " deterministic"
    return s


# ---- the engine's backward through the C API ----------------------------------------------------
class Backward:
    """fa_attention_backward on an oracle_attention.Engine (its library,
    context and option builder), returning torch tensors."""

    def __init__(self, eng):
        self.eng = eng
        L = eng.lib
        vp, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
        L.fa_attention_backward.argtypes = [vp] * 7 + [ctypes.POINTER(oa.AttnOpts)] + [ctypes.POINTER(vp)] * 3
        L.fa_attention_backward.restype = ctypes.c_int
        L.fa_tensor_ndim.argtypes = [vp]
        L.fa_tensor_ndim.restype = ctypes.c_int
        L.fa_tensor_size.argtypes = [vp, ctypes.c_int]
        L.fa_tensor_size.restype = ctypes.c_int64
        L.fa_tensor_dtype.argtypes = [vp]
        L.fa_tensor_dtype.restype = ctypes.c_int
        L.fa_tensor_device.argtypes = [vp]
        L.fa_tensor_device.restype = ctypes.c_int
        L.fa_tensor_copy.argtypes = [vp, vp, vp]
        L.fa_tensor_copy.restype = ctypes.c_int
        L.fa_tensor_empty.argtypes = [vp, ctypes.c_int, i64p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(vp)]
        L.fa_tensor_empty.restype = ctypes.c_int
        L.fa_tensor_fill.argtypes = [vp, vp, ctypes.c_double]
        L.fa_tensor_fill.restype = ctypes.c_int

    def poison(self, shapes, dtype_name):
        """Engine tensors of these shapes filled with NaN and released: back
        in the engine's stream-ordered pool, where the backward's own
        allocations of the same sizes are likely to land."""
        eng, L = self.eng, self.eng.lib
        with eng._held() as held:
            for shape in shapes:
                t = ctypes.c_void_p()
                arr = (ctypes.c_int64 * len(shape))(*shape)
                eng.check(L.fa_tensor_empty(eng.ctx, len(shape), arr, oa.FA_DTYPES[dtype_name], oa.FA_CUDA,
                                            ctypes.byref(t)), "fa_tensor_empty")
                held.append(t)
                eng.check(L.fa_tensor_fill(eng.ctx, t, float("nan")), "fa_tensor_fill")

    def to_torch(self, t, shape, dtype_name, what, problems):
        """The engine tensor t as a new torch tensor (a copy on the context's
        stream), after checking its shape, dtype and device; None when they
        are wrong (the reason into problems)."""
        eng, L = self.eng, self.eng.lib
        got = [L.fa_tensor_size(t, i) for i in range(L.fa_tensor_ndim(t))]
        if got != list(shape):
            problems.append(f"{what} has shape {got}, expected {list(shape)}")
            return None
        if L.fa_tensor_dtype(t) != oa.FA_DTYPES[dtype_name]:
            problems.append(f"{what} has dtype {L.fa_tensor_dtype(t)}, expected {dtype_name} (q's)")
            return None
        if L.fa_tensor_device(t) != oa.FA_CUDA:
            problems.append(f"{what} is not on cuda (device {L.fa_tensor_device(t)})")
            return None
        out = torch.empty(shape, device="cuda", dtype=oa.TORCH_DTYPES[dtype_name])
        with eng._held() as held:
            w = eng.wrap(out, dtype_name)
            held.append(w)
            eng.check(L.fa_tensor_copy(eng.ctx, w, t), f"fa_tensor_copy({what})")
        return out

    def backward(self, c, q, k, v, o, lse, lse_in, dout, mask):
        """fa_attention_backward for case c: (dq, dk, dv) as torch tensors
        (None where the engine's tensor is wrong) and the problems found.
        lse: the forward's f32 lse (for the option builder), lse_in: the
        tensor handed to the backward (lse or a conversion of it)."""
        eng, L = self.eng, self.eng.lib
        dt = c["dtype"]
        arrays = []
        with eng._held() as held:
            for x, name in ((q, dt), (k, dt), (v, dt), (o, dt), (dout, dt),
                            (lse_in, {torch.float32: "f32", torch.float64: "f64"}[lse_in.dtype])):
                held.append(eng.wrap(x, name))  # one by one: released even when a later wrap fails
            tq, tk, tv, to, td, tl = held[:6]
            opts = eng.opts(c, mask, o, lse, held, arrays)
            opts.out = opts.lse_out = None  # the backward does not use them (nor return_lse, algo)
            opts.return_lse = 0
            opts.deterministic = 1 if c.get("deterministic") else 0
            gq, gk, gv = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
            st = L.fa_attention_backward(eng.ctx, tq, tk, tv, to, tl, td, ctypes.byref(opts), ctypes.byref(gq),
                                         ctypes.byref(gk), ctypes.byref(gv))
            held += [gq, gk, gv]
            eng.check(st, "fa_attention_backward")
            problems = []
            shapes = grad_shapes(c)
            grads = tuple(self.to_torch(t, s, dt, n, problems)
                          for t, s, n in zip((gq, gk, gv), shapes, ("dq", "dk", "dv")))
            eng.check(L.fa_sync(eng.ctx), "fa_sync")
        return grads, problems


def grad_shapes(c):
    B, Hq, Hkv, Lq, Lk, D, Dv = (c[x] for x in ("B", "Hq", "Hkv", "Lq", "Lk", "D", "Dv"))
    return (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)


# ---- inputs and the reference --------------------------------------------------------------------
def make_inputs(c):
    """q, k, v, dout in the case's layout, and the mask (None, bool or float)."""
    dt = oa.TORCH_DTYPES[c["dtype"]]
    # oracle_attention's inputs: bhld, blhd, packed (k, v from one (B, L, 2, H, D)), padded; and the mask
    q, k, v, mask = oa.make_inputs(dict(c, layout="blhd" if c["layout"] == "qkv" else c["layout"]))
    g = torch.Generator(device="cuda")
    g.manual_seed(c["seed"] * 7919 + c["idx"] + 500009)
    if c["layout"] == "qkv":  # one (B, L, Hq + 2 Hkv, D) tensor, narrowed along the heads
        Hq, Hkv = c["Hq"], c["Hkv"]
        t = torch.randn(c["B"], c["Lq"], Hq + 2 * Hkv, c["D"], device="cuda", generator=g).to(dt)
        q, k, v = (t[:, :, :Hq].transpose(1, 2), t[:, :, Hq:Hq + Hkv].transpose(1, 2),
                   t[:, :, Hq + Hkv:].transpose(1, 2))
    lay = {"qkv": "blhd", "packed": "blhd"}.get(c["layout"], c["layout"])
    dout = oa.layout_tensor(g, c, lay, dt, c["Hq"], c["Lq"], c["Dv"])
    return q, k, v, dout, mask


def math_attention(c, q, k, v, mask, keep, dt, scores=False):
    """o of the engine's function, every operation in dtype dt (q, k, v
    already of dt; autograd through it), which (b, h, i, j) take part
    (alive, a detached bool (B, Hq, Lq, Lk)) and the rows' lse; with scores,
    also the scores (masked keys -inf, rows with no key 0) and vx (v read
    by each query head)."""
    B, Hq, Hkv, Lq, Lk = c["B"], c["Hq"], c["Hkv"], c["Lq"], c["Lk"]
    G = Hq // Hkv
    scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(c["D"])
    kx = k.repeat_interleave(G, dim=1) if G > 1 else k  # query head h reads KV head h // G
    vx = v.repeat_interleave(G, dim=1) if G > 1 else v
    s = torch.matmul(q, kx.transpose(-1, -2)) * scale
    if c["softcap"] is not None:
        s = torch.tanh(s / c["softcap"]) * c["softcap"]
    if c["alibi"] is not None:
        i = torch.arange(Lq, device="cuda").view(Lq, 1)
        j = torch.arange(Lk, device="cuda").view(1, Lk)
        dist = (i + Lk - Lq - j).abs().to(dt)
        slopes = torch.tensor(c["alibi"], device="cuda", dtype=dt).view(1, Hq, 1, 1)
        s = s - slopes * dist
    allowed = keep
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            s = s + mask.to(dt)
    s = s.masked_fill(~allowed, float("-inf"))
    alive = (s != float("-inf")).detach()
    empty = ~alive.any(dim=-1, keepdim=True)
    s = s.masked_fill(empty, 0.0)  # a row with no key: no NaN through softmax, zero gradient
    p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    o = torch.matmul(p, vx)
    if scores:
        return o, alive.expand(B, Hq, Lq, Lk), torch.logsumexp(s, dim=-1), s, vx
    return o, alive.expand(B, Hq, Lq, Lk), torch.logsumexp(s, dim=-1)


def autograd_grads(c, q, k, v, dout, mask, keep, dt):
    """(o, (dq, dk, dv), alive) of math_attention in dtype dt."""
    leaves = [x.detach().to(dt).requires_grad_() for x in (q, k, v)]
    o, alive, _ = math_attention(c, *leaves, mask, keep, dt)
    grads = torch.autograd.grad(o, leaves, dout.to(dt))
    return o.detach(), grads, alive


def o_rounding_grads(c, q, k, v, dout, mask, keep, dt):
    """The gradients FlashAttention's method gives in exact (f64) arithmetic
    from an o stored in dtype dt.  Its backward takes D_i = rowsum(dout * o)
    from the stored o (the math path's softmax backward takes it from P and
    dP), so o's rounding shifts dS_ij by -P_ij dD_i, with dD_i = rowsum(dout *
    (o_dt - o)).  d lse_i / d s_ij = P_ij, so subtracting sum_i dD_i lse_i from
    the loss adds exactly that shift.  Where a row has few keys nothing
    averages it out: at bf16, D = 96, rows of 1 to 5 keys (seed 57, case 104)
    it alone is 0.02 to 0.04 on dk, as large as the math path's whole bf16
    error."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o, _, lse = math_attention(c, *leaves, mask, keep, torch.float64)
    od = o.detach()
    dd = (dout.double() * (od.to(dt).double() - od)).sum(dim=-1)
    loss = (o * dout.double()).sum() - (dd * lse).sum()
    return torch.autograd.grad(loss, leaves)


def fa_form_grads(c, q, k, v, dout, mask, keep):
    """dq, dk as FlashAttention's method computes them, every operation in
    f32 as the engine's at every dtype (in bf16 or f16 throughout it would
    loosen those cases' limits past the math path's): P = exp(s - lse),
    dP = dout v^T, D_i = rowsum(dout * o) from the o of the same
    precision, dS = P (dP - D_i) (the autograd of
    sum(P * (dP - D)) with lse, dP and D held constant, so that dS goes
    through the score rule as the engine's chain rule takes it).  The math
    path's softmax backward takes D_i as sum_j P_ij dP_ij instead: where a
    row has one key (P = 1) it gives dS = 0 exactly, while D_i and dP_ii,
    two dot products over D summed apart, differ by their rounding (f32,
    D = 256, window (0, 0), scale 1: 1.2e-4 on dq, seed 5703 case 205).
    Its error is the precision's own for this method."""
    dt = torch.float32
    leaves = [x.detach().to(dt).requires_grad_() for x in (q, k)]
    o, alive, lse, s, vx = math_attention(c, *leaves, v.detach().to(dt), mask, keep, dt, scores=True)
    do = dout.to(dt)
    with torch.no_grad():
        cst = torch.matmul(do, vx.transpose(-1, -2)) - (do * o).sum(dim=-1, keepdim=True)
    p = torch.exp(s - lse.detach().unsqueeze(-1)).masked_fill(~alive, 0.0)
    return torch.autograd.grad((p * cst).sum(), leaves)


def sdpa_grads(c, q, k, v, dout, mask, keep, alive):
    """PyTorch SDPA's own autograd in f32 on the upcast inputs, the score
    rule folded into attn_mask: (grads, None), or (None, why not)."""
    if c["softcap"] is not None:
        return None, "softcap has no SDPA form"
    if not alive.any(dim=-1).all():
        return None, "a row with no key (SDPA's fully masked rows differ by backend)"
    import torch.nn.functional as F
    B, Hq, Lq, Lk = c["B"], c["Hq"], c["Lq"], c["Lk"]
    scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(c["D"])
    allowed = keep
    bias = None
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            bias = mask.float().expand(B, Hq, Lq, Lk)
    if c["alibi"] is not None:
        i = torch.arange(Lq, device="cuda").view(Lq, 1)
        j = torch.arange(Lk, device="cuda").view(1, Lk)
        slopes = torch.tensor(c["alibi"], device="cuda", dtype=torch.float32).view(1, Hq, 1, 1)
        a = -slopes * (i + Lk - Lq - j).abs().float()
        bias = a.expand(B, Hq, Lq, Lk) if bias is None else bias + a
    kw = {"scale": scale}
    only_top_left = (c["causal"] == "top_left" and c["window"] is None and c["kv_lens"] is None and mask is None
                     and bias is None)
    if only_top_left:
        kw["is_causal"] = True  # SDPA's own causal (top-left)
    elif bias is not None:
        kw["attn_mask"] = bias.masked_fill(~allowed, float("-inf")).contiguous()
    elif c["causal"] != "none" or c["window"] is not None or c["kv_lens"] is not None or mask is not None:
        kw["attn_mask"] = allowed.expand(B, Hq, Lq, Lk).contiguous()
    if c["Hq"] != c["Hkv"]:
        kw["enable_gqa"] = True
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    try:
        o = F.scaled_dot_product_attention(*leaves, **kw)
        return torch.autograd.grad(o, leaves, dout.float()), None
    except (RuntimeError, TypeError, AttributeError) as e:  # AttributeError: a torch without SDPA
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def same_bits(a, b):
    """Bit-identical (NaN equal to itself)."""
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    w = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
    return torch.equal(a.contiguous().view(-1).view(w), b.contiguous().view(-1).view(w))


def max_abs(x):
    return x.abs().max().item() if x.numel() else 0.0


def finite_err(x, ref):
    """(max |x - ref| over the finite differences, 0 if none; whether all were finite)."""
    d = (x.double() - ref).abs()
    finite = torch.isfinite(d)
    return (d[finite].max().item() if finite.any() else 0.0), bool(finite.all())


def judge_grad(name, g, ref, lp, oround, floor, fa=None):
    """(ok, figures, message) for one gradient: FlashAttention's criterion,
    plus the error that the stored o's rounding alone brings (oround: see
    o_rounding_grads), which the math path's autograd does not have; the
    low-precision error is the larger of the math path's (lp) and, for dq
    and dk, FlashAttention's method's in f32 (fa: fa_form_grads)."""
    diff = (g.double() - ref).abs()
    err = max_abs(torch.nan_to_num(diff, nan=math.inf))
    err_lp, lp_finite = finite_err(lp, ref)
    err_fa = finite_err(fa, ref)[0] if fa is not None else 0.0
    err_o = max_abs(oround - ref)
    limit = 2 * max(err_lp, err_fa) + err_o + floor
    ok = err <= limit
    fig = {"err": err, "err_torch_lowp": err_lp, "err_fa_form": err_fa, "err_o_rounding": err_o, "floor": floor,
           "limit": limit, "max_ref": max_abs(ref), "ok": ok}
    msg = f"{name} err {err:.3g} (torch {err_lp:.3g}, FA's form {err_fa:.3g}, o's rounding {err_o:.3g}, " \
          f"limit {limit:.3g})"
    if not lp_finite:
        fig["torch_lowp_nonfinite"] = True
        msg += " [torch low precision non-finite]"
    return ok, fig, msg


# ---- one case ----------------------------------------------------------------------------------
def run_case(bw, c, verbose):
    """The case's record: ok, deterministic, message and figures."""
    dt = oa.TORCH_DTYPES[c["dtype"]]
    rec = {"idx": c["idx"], "case": describe(c), "params": c, "ok": False, "deterministic": True, "errors": {}}
    q, k, v, dout, mask = make_inputs(c)
    out, lse, _, _ = oa.make_outputs(dict(c, layout="packed" if c["layout"] == "qkv" else c["layout"]))
    strides = [x.stride(i) for x in (q, k, v, out, dout) for i in range(3)] + \
              [x.data_ptr() // x.element_size() for x in (q, k, v, out, dout)]
    rec["path"] = expected_path(c, strides)
    bw.eng.attention(q, k, v, c, mask, out, lse)
    lse_in = lse if c["lse_dtype"] == "f32" else lse.double()
    inputs = [q, k, v, out, lse_in, dout] + ([mask] if mask is not None else [])
    saved = [x.clone() for x in inputs]
    runs, problems = [], []
    for _ in range(2):
        bw.poison(grad_shapes(c), c["dtype"])
        grads, why = bw.backward(c, q, k, v, out, lse, lse_in, dout, mask)
        runs.append(grads)
        problems += why
    if problems:
        rec["msg"] = "; ".join(sorted(set(problems)))
        return rec
    if not all(same_bits(a, b) for a, b in zip(inputs, saved)):
        problems.append("the backward changed an input (q, k, v, o, lse, dout or mask)")
    # dk and dv have one owner an element always; dq too when the case asks for determinism (else
    # the wgmma kernel adds it up with atomics, whose order varies)
    pairs = list(zip(*runs))
    rec["deterministic"] = all(same_bits(a, b) for a, b in (pairs if c.get("deterministic") else pairs[1:]))
    if not c.get("deterministic"):
        rec["dq_run_diff"] = max_abs(runs[0][0].double() - runs[1][0].double())
    dq, dk, dv = runs[0]

    keep = oa.keep_mask(c)
    o64, ref, alive = autograd_grads(c, q, k, v, dout, mask, keep, torch.float64)
    _, lp, _ = autograd_grads(c, q, k, v, dout, mask, keep, torch.float32 if c["dtype"] == "f32" else dt)
    orr = o_rounding_grads(c, q, k, v, dout, mask, keep, dt)
    fa = list(fa_form_grads(c, q, k, v, dout, mask, keep)) + [None]  # (dv: the math path's alone)
    rec["forward_err"] = max_abs(out.double() - o64)  # informational: oracle_attention.py judges the forward
    scale = max(max_abs(g) for g in ref)
    floor = REL_FLOOR[c["dtype"]] * scale
    ok, msgs = True, []
    for name, g, r64, rlp, ro, rfa in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, lp, orr, fa):
        gok, fig, m = judge_grad(name, g, r64, rlp, ro, floor, rfa)
        rec["errors"][name] = fig
        msgs.append(m)
        ok &= gok
        if not torch.isfinite(g).all():
            problems.append(f"NaN/inf in {name}")
    # exact zeros: dq on rows with no key, dk / dv on keys no row of their group takes
    G = c["Hq"] // c["Hkv"]
    empty_rows = ~alive.any(dim=-1)  # (B, Hq, Lq)
    dead_keys = ~alive.reshape(c["B"], c["Hkv"], G * c["Lq"], c["Lk"]).any(dim=2)  # (B, Hkv, Lk)
    if empty_rows.any() and not (dq[empty_rows] == 0).all():
        problems.append(f"dq not exactly 0 on the {int(empty_rows.sum())} rows with no key")
    if dead_keys.any() and not ((dk[dead_keys] == 0).all() and (dv[dead_keys] == 0).all()):
        problems.append(f"dk/dv not exactly 0 on the {int(dead_keys.sum())} keys no row takes")
    rec["empty_rows"], rec["dead_keys"] = int(empty_rows.sum()), int(dead_keys.sum())
    # informational: PyTorch SDPA's own autograd in f32
    sg, why = sdpa_grads(c, q, k, v, dout, mask, keep, alive)
    if sg is None:
        rec["sdpa"] = why
    else:
        for name, g, r64 in zip(("dq", "dk", "dv"), sg, ref):
            rec["errors"][name]["sdpa_f32_err"] = max_abs(g.double() - r64)
    ok = ok and not problems
    rec["ok"] = ok
    rec["msg"] = "; ".join(msgs + problems)
    if verbose:
        print(f"{'ok  ' if ok else 'FAIL'} [{rec['path']}] {describe(c)}: {rec['msg']}", flush=True)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="The criterion and usage: scripts/oracle_backward.py's docstring")
    ap.add_argument("--lib", default="build-gpu/libflashattn.so", help="libflashattn.so of a CUDA build")
    ap.add_argument("--cases", type=int, default=300, help="random cases (the forced ones come on top)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--case", type=int, default=None, help="replay this case of the grid alone (same --seed)")
    ap.add_argument("--max-elems", type=int, default=3 << 20, help="bound on B*Hq*Lq*Lk of a case")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--commit", default=os.environ.get("FA_COMMIT") or "unknown",
                    help="the commit measured (default: FA_COMMIT, which scripts/gpu_carried.sh sets)")
    ap.add_argument("--list", action="store_true", help="print the grid's cases and exit (no GPU, no torch)")
    ap.add_argument("--verbose", action="store_true", help="one line per case")
    a = ap.parse_args()
    forced = forced_cases(a.seed)
    if a.case is not None:
        cases = [c for c in forced if c["idx"] == a.case] or [draw_case(a.case, a.seed, a.max_elems)]
    else:
        cases = forced + [draw_case(i, a.seed, a.max_elems) for i in range(a.cases)]
    if a.list:
        for c in cases:
            print(f"[{expected_path(c)}] {describe(c)}")
        return

    load_torch()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # torch's low-precision peer accumulates in f32 as the engine does (no reduced-precision GEMM reductions)
    for flag in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        try:
            setattr(torch.backends.cuda.matmul, flag, False)
        except (AttributeError, AssertionError):  # a torch without the flag
            pass
    eng = oa.Engine(a.lib)
    bw = Backward(eng)
    t0 = time.time()
    records, fails, nondet, errors = [], [], [], []
    counts = {}
    for c in cases:
        try:
            rec = run_case(bw, c, a.verbose)
        except RuntimeError as e:  # an engine error on a valid call (cuda takes every option but Lua variants)
            engine = isinstance(e, oa.EngineError)
            rec = {"idx": c["idx"], "case": describe(c), "params": c, "ok": False, "deterministic": True,
                   "errors": {}, "path": expected_path(c),
                   "msg": f"engine error: {e}" if engine else f"error in the oracle: {type(e).__name__}: {e}"}
            if engine:
                errors.append(c["idx"])
        records.append(rec)
        for key, val in (("dtype", c["dtype"]), ("path", rec.get("path")), ("layout", c["layout"]),
                         ("causal", c["causal"])):
            counts.setdefault(key, {}).setdefault(str(val), 0)
            counts[key][str(val)] += 1
        for key in ("window", "softcap", "alibi", "mask", "kv_lens", "scale"):
            if c[key] is not None:
                counts.setdefault("options", {}).setdefault(key, 0)
                counts["options"][key] += 1
        if not rec["ok"]:
            fails.append(c["idx"])
            print(f"FAIL [{rec.get('path')}] {describe(c)}: {rec['msg']}", flush=True)
        if not rec["deterministic"]:
            nondet.append(c["idx"])
            print(f"NONDET [{rec.get('path')}] {describe(c)}: two runs of the backward differ", flush=True)
    secs = time.time() - t0
    eng.close()
    sd = [r for r in records if "errors" in r and all("sdpa_f32_err" in f for f in r["errors"].values())
          and r["errors"]]
    line = (f"oracle_backward: {len(cases)} cases, {len(fails)} failures ({len(errors)} engine errors), "
            f"{len(nondet)} not bit-identical when run twice ({secs:.0f} s, seed {a.seed}); "
            f"paths {counts.get('path', {})}; SDPA f32 cross-check on {len(sd)} cases")
    print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                "commit": a.commit, "seed": a.seed, "max_elems": a.max_elems,
                                "command": " ".join(sys.argv), "seconds": round(secs, 1),
                                "criterion": "per gradient g in dq, dk, dv: max|g - ref64| <= 2 max(max|g_torch - ref64|, "
                                             "max|g_fa - ref64|) + max|g_oround - ref64| + floor, g_fa (dq, dk) = "
                                             "FlashAttention's method in f32 (D_i from o, dS = P (dP - D_i)), "
                                             "g_oround = ref64's math with "
                                             "D_i = rowsum(dout * o) taken from o rounded to the dtype "
                                             "(FlashAttention's method in exact arithmetic), ref64 = autograd of the math in f64 on the upcast inputs, "
                                             "g_torch = the same in the inputs' dtype (f32 for f32), floor = "
                                             "1e-3 (f16/bf16) or 1e-5 (f32) x max|ref64| over the case's three "
                                             "gradients; no NaN/inf; dq exactly 0 on rows with no key, dk/dv "
                                             "exactly 0 on keys no row takes; inputs unchanged; two runs "
                                             "bit-identical (the engine's pool NaN-poisoned before each). "
                                             "sdpa_f32_err: torch SDPA's autograd in f32 (informational)"},
                       "summary": {"cases": len(cases), "failures": len(fails), "engine_errors": len(errors),
                                   "nondeterministic": len(nondet), "counts": counts, "failed": fails,
                                   "not_bit_identical": nondet},
                       "cases": records}, f, indent=1, default=str)
    sys.exit(1 if fails or nondet else 0)


if __name__ == "__main__":
    main()
