"""The outside oracle for the attention variants of API §9 (score_mod and
mask_mod written in Lua, docs/variants.md), PyTorch side.

scripts/oracle_variants.lua runs the engine on seeded cases (the five examples
of §9, two compositions, random compositions) and writes, per case, the rules
as expression trees, the captured tensors, q, k, v, the engine's o and lse
(each call made twice: `deterministic` says whether the two were
bit-identical) and fa.attention_reference's f64 o and lse, into one folder
with cases.json.  This script recomputes every case from the trees and judges
the engine.

The trees become Python functions (source generated from the tree, so that
torch.compile's tracer, which FlexAttention runs even eagerly, sees plain
straight-line torch code).  Positions: the engine's b, h, q, k are 1-based
and FlexAttention's b, h, q_idx, kv_idx 0-based, so the functions get 1 +
each index (as floats of the evaluation dtype: positions are integers, exact
there) and a read t[i][j] indexes the tensor at (i - 1, j - 1) through
torch.ops.aten.index (what FlexAttention turns t[i] into under its vmap),
clamped into range (a read that fa.where discards may be out of range, as in
the engine).
`%` is Lua's floored modulo (torch.remainder), `/` true division, `^` a
float power.  The score_mod is evaluated in f64 for an f64 run and in f32
otherwise (the engine evaluates in f64 on the CPU and f32 on the GPU);
mask_mod always in f64 (its position terms and constants are integers, so
every evaluation agrees).  causal is ANDed into the mask as the engine
aligns it (bottom-right: k <= q + Lk - Lq).  GQA: query head h reads KV head
(h - 1) // (H / Hkv) + 1 (FlexAttention's enable_gqa).

References:
  flex      torch.nn.attention.flex_attention.flex_attention (eager: no
            torch.compile of ours; small shapes), with create_block_mask(B, H)
            for the mask and the lse it returns (natural log: the public API
            converts its kernels' base-2 lse), the reference run in float64
            (float32 when this torch refuses f64; recorded) on the f32/f16
            values of q, k, v upcast, and the peer run in the case's dtype.
  dense     the same function computed densely by this script: S = scale QK^T
            materialised (Lq x Lk), score_mod and mask applied, softmax, PV.
            In float64 it is a second reference; in the case's dtype it
            emulates a low-precision peer (arithmetic in f32, P rounded to
            the dtype for PV and O rounded, as FlashAttention's kernels do).
            It needs no FlexAttention: it is the reference and peer when
            FlexAttention is missing (torch < 2.5) or with --self-check, and
            is recorded as such.
  Whenever flex ran, its f64 output must agree with the dense f64 one (1e-8;
  1e-4 for an f32 flex reference): otherwise the oracle itself is wrong.
  Whenever the case folder holds fa.attention_reference's output (the
  engine's own f64 evaluation of the Lua functions built from the same
  trees), the dense f64 result must agree with it to 1e-8 (lse relative):
  this checks the tree -> Lua and tree -> torch translations against each
  other, with no GPU and no FlexAttention.  --self-check leaves FlexAttention
  out: this check, and the criterion below against the dense references.
  A case on which FlexAttention fails (its tracer, an option this torch
  refuses) is judged against the dense references, printed as NOTE and
  listed in the JSON's flex_errors (ORACLE_TRACEBACK=1 prints the traceback).

Criterion (FlashAttention's, as scripts/oracle_attention.py): over the rows
that attend at least one key,
  max |o_engine - o_ref| <= 2 max |o_peer - o_ref| + slack,
  slack 1e-5 for f32 (the SIMT kernel; the engine's f32 outputs are about
  unit size), 1e-3 for bf16/f16 (the engine and the peer both round their
  output to the dtype, a few 1e-3 at |o| ~ 1, so the factor 2 carries the
  comparison and the slack only covers a peer that happens to round better);
  max |lse_engine - lse_ref| <= 2 max |lse_peer - lse_ref| + slack,
  slack 1e-5 max(1, max |lse_ref|) for f32, 1e-4 for bf16/f16 (lse is f32
  in the engine for every input dtype).
The reference is the f64 one (flex, else dense), o_peer and lse_peer the
peer in the case's dtype.  Rows that attend no key (mask and causal leave
none) must be exact zeros in the engine with lse = -inf (FlexAttention's
zeros and -inf there are not compared), every other engine lse finite, and
the engine's o free of NaN/inf.  A case whose engine call failed, or whose
two calls were not bit-identical, is a failure too.

The backward (API §10), when the folder holds the engine's dq, dk, dv for
its dout: the reference computes them densely in f64 from the same rules,
P and dP = dO V^T materialised, delta = rowsum(dO o) over the exact o,
dS = P (dP - delta) times score_mod's derivative by s (torch.autograd on
the rule's function, elementwise) times the scale, zero at the pairs the
mask leaves out (they pass nothing back, whatever the rule's derivative is
there), dQ = dS K, dK = dS^T Q, dV = P^T dO (summed over the query heads
that share a KV head); the peer is the same in f32 from the dtype's values,
with delta from o rounded to the dtype (the forward's output, which the
backward reads: FlashAttention's scheme), P and dS rounded to the dtype
before the products (the operands PyTorch's autograd in that dtype
multiplies, and FlashAttention's kernels too: FlashAttention's tests hold
its backward against PyTorch in the dtype; with P and dS in f32 the peer
was a class more precise than any bf16 kernel, and the engine's gradients
sat at 1-2.7x its error, two cases in 110 past 2x + slack, by 1.02x and
1.0002x) and its gradients rounded to the dtype.  Criterion per gradient:
  max |g_engine - g_ref| <= 2 max |g_peer - g_ref| + slack,
  slack 1e-5 max(1, max |g_ref|) for f32, 1e-3 max(1, max |g_ref|) for
  bf16/f16; the engine's gradients free of NaN/inf.

Usage (GPU machine, after the engine's run):
  build-gpu/flashattn-lua scripts/oracle_variants.lua --out out/ov --cases 40
  python3 scripts/oracle_variants.py --dir out/ov --json out/oracle_variants.json [--commit C]
Without FlexAttention or a GPU (the dense references only):
  python3 scripts/oracle_variants.py --dir /tmp/ov --json /tmp/ov.json --self-check
Prints a line per failure and a summary line
  oracle_variants: N cases, F failures, D not bit-identical
writes OUT.json (meta: date, GPU, torch version, commit, references, the
criterion; per case its shape, rules, reference and peer used, errors,
limits, verdict) and exits 1 on any failure.
"""
import argparse
import datetime
import importlib
import inspect
import json
import math
import os
import sys
import time

torch = np = None  # imported in main, so that --help runs without them

# ---- trees -> Python source ---------------------------------------------------------
ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
UNARY_T = {"abs": "torch.abs", "exp": "torch.exp", "log": "torch.log", "tanh": "torch.tanh", "sqrt": "torch.sqrt",
           "floor": "torch.floor"}
UNARY_C = {"abs": "abs", "exp": "math.exp", "log": "_clog", "tanh": "math.tanh", "sqrt": "_csqrt",
           "floor": "_cfloor"}
POSITIONS = ("s", "b", "h", "q", "k")


def _clog(x):
    return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)


def _csqrt(x):
    return math.sqrt(x) if x >= 0 else math.nan


def _cfloor(x):
    return float(math.floor(x))


def _cpow(a, b):
    try:
        r = math.pow(a, b)
    except (ValueError, OverflowError):
        return math.nan
    return r


def _cmod(a, b):  # Lua's float %: the sign of the divisor (Python's %), nan for b = 0
    try:
        return a % b
    except ZeroDivisionError:
        return math.nan


def _ix(x, n):
    """0-based index of a 1-based position tensor, clamped into 0..n-1."""
    return (x - 1).long().clamp(0, n - 1)


def _cix(x, n):
    return min(max(int(x) - 1, 0), n - 1)


class TreeError(ValueError):
    pass


def gen(node, mask, shapes):
    """(source, constant, kind) of a node: constant when the subtree has no
    position, score or tensor read (a plain Python value), kind "num" or
    "bool"."""
    op = node.get("op")
    if op in POSITIONS:
        if mask and op == "s":
            raise TreeError("a mask_mod tree uses s")
        return op, False, "num"
    if op == "const":
        v = node["value"]
        if isinstance(v, bool):
            return repr(v), True, "bool"
        v = float(v)
        if not math.isfinite(v):
            raise TreeError("a constant must be finite")
        return f"({v!r})", True, "num"
    if op == "read":
        name = node["tensor"]
        if name not in shapes:
            raise TreeError(f"tensor {name!r} is not in the case")
        shape = shapes[name]
        if len(node["index"]) != len(shape):
            raise TreeError(f"tensor {name!r} read with {len(node['index'])} of its {len(shape)} indices")
        parts = []
        for i, n in zip(node["index"], shape):
            src, const, kind = gen(i, mask, shapes)
            if kind != "num":
                raise TreeError("a tensor index is a boolean")
            parts.append((f"_cix({src}, {n})" if const else f"_ix({src}, {n})", const))
        if all(const for _, const in parts):
            return f"T[{name!r}][{', '.join(p for p, _ in parts)}]", False, "num"
        # aten.index with index tensors (as FlexAttention turns t[i] into): no __getitem__ under vmap
        first = next(p for p, const in parts if not const)
        idx = [f"torch.full_like({first}, {p})" if const else p for p, const in parts]
        return f"torch.ops.aten.index(T[{name!r}], [{', '.join(idx)}])", False, "num"
    if op == "where":
        cs, cc, _ = gen(node["c"], mask, shapes)
        a_s, ac, ak = gen(node["a"], mask, shapes)
        bs, bc, bk = gen(node["b"], mask, shapes)
        if ak != bk:
            raise TreeError("where chooses between a number and a boolean")
        if cc:
            return f"({a_s} if {cs} else {bs})", ac and bc, ak
        dt = ", dtype=DT" if ak == "num" else ""
        if ac:
            a_s = f"torch.full_like({cs}, {a_s}{dt})"
        if bc:
            bs = f"torch.full_like({cs}, {bs}{dt})"
        return f"torch.where({cs}, {a_s}, {bs})", False, ak
    if op == "neg":
        a_s, ac, _ = gen(node["a"], mask, shapes)
        return f"(-{a_s})", ac, "num"
    if op == "not":
        a_s, ac, _ = gen(node["a"], mask, shapes)
        return (f"(not {a_s})" if ac else f"(~{a_s})"), ac, "bool"
    if op in UNARY_T:
        a_s, ac, _ = gen(node["a"], mask, shapes)
        return (f"{UNARY_C[op]}({a_s})" if ac else f"{UNARY_T[op]}({a_s})"), ac, "num"
    if "a" not in node or "b" not in node:
        raise TreeError(f"unknown op {op!r}")
    a_s, ac, ak = gen(node["a"], mask, shapes)
    bs, bc, bk = gen(node["b"], mask, shapes)
    const = ac and bc
    if op in ARITH:
        if const and op == "pow":
            return f"_cpow({a_s}, {bs})", True, "num"
        if const and op == "div":
            return f"_cdiv({a_s}, {bs})", True, "num"
        return f"({a_s} {ARITH[op]} {bs})", const, "num"
    if op == "mod":
        if const:
            return f"_cmod({a_s}, {bs})", True, "num"
        if ac:
            a_s = f"torch.full_like({bs}, {a_s})"
        return f"torch.remainder({a_s}, {bs})", False, "num"
    if op in ("min", "max"):
        if const:
            return f"{op}({a_s}, {bs})", True, "num"
        if ac or bc:
            t, c = (bs, a_s) if ac else (a_s, bs)
            return f"torch.clamp({t}, {'max' if op == 'min' else 'min'}={c})", False, "num"
        return f"torch.{'minimum' if op == 'min' else 'maximum'}({a_s}, {bs})", False, "num"
    if op in CMP:
        if op in ("eq", "ne") and ak != bk:
            raise TreeError(f"{op} compares a number with a boolean")
        return f"({a_s} {CMP[op]} {bs})", const, "bool"
    if op in ("and", "or"):
        if const:
            return f"({a_s} {op} {bs})", True, "bool"
        return f"({a_s} {'&' if op == 'and' else '|'} {bs})", False, "bool"
    raise TreeError(f"unknown op {op!r}")


def _cdiv(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        return math.nan if a == 0 else math.copysign(math.inf, a) * math.copysign(1.0, b)


def compile_tree(tree, mask, shapes, what):
    """f(s, b, h, q, k, T, DT) -> the tree's value: b, h, q, k 1-based
    position tensors (floats, broadcastable), T name -> tensor, DT the
    evaluation dtype; returns a tensor or a plain constant.  Also its source."""
    body, _, kind = gen(tree, mask, shapes)
    if kind != ("bool" if mask else "num"):
        raise TreeError(f"{what} returns a {kind}")
    src = f"def f(s, b, h, q, k, T, DT):\n    return {body}\n"
    ns = {"torch": torch, "math": math, "_ix": _ix, "_cix": _cix, "_clog": _clog, "_csqrt": _csqrt,
          "_cfloor": _cfloor, "_cpow": _cpow, "_cmod": _cmod, "_cdiv": _cdiv}
    exec(compile(src, f"<{what}>", "exec"), ns)
    return ns["f"], src


# ---- the case ---------------------------------------------------------------------
class Case:
    def __init__(self, c, folder, dev):
        self.c = c
        self.dev = dev
        self.B, self.H, self.Hkv = c["B"], c["H"], c["Hkv"]
        self.Lq, self.Lk, self.D = c["Lq"], c["Lk"], c["D"]
        self.dtype = c["dtype"]
        self.causal = bool(c.get("causal"))
        self.scale = float(c["scale"]) if c.get("scale") is not None else 1.0 / math.sqrt(self.D)
        tensors = c.get("tensors") or {}
        self.shapes = {name: list(t["shape"]) for name, t in tensors.items()}
        # the f32 values the engine read (the JSON numbers rounded as fa.tensor rounds them)
        t32 = {name: torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"]) for name, t in tensors.items()}
        self.T = {dt: {n: t.to(dev, dt) for n, t in t32.items()} for dt in (torch.float32, torch.float64)}
        self.score_fn = self.mask_fn = None
        self.src = {}
        if c.get("score_mod"):
            self.score_fn, self.src["score_mod"] = compile_tree(c["score_mod"], False, self.shapes,
                                                                f"case {c['id']} score_mod")
        if c.get("mask_mod"):
            self.mask_fn, self.src["mask_mod"] = compile_tree(c["mask_mod"], True, self.shapes,
                                                              f"case {c['id']} mask_mod")
        files = c.get("files") or {}
        self.arrays = {}
        for key, name in files.items():
            a = np.load(os.path.join(folder, name))
            self.arrays[key] = torch.from_numpy(np.ascontiguousarray(a))

    def lowp(self):
        return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[self.dtype]

    def inputs(self, dt):
        """q, k, v on the device in dtype dt (upcast from the case dtype's exact values)."""
        low = self.lowp()
        return [self.arrays[x].to(self.dev).to(low).to(dt) for x in ("q", "k", "v")]

    # -- the dense computation --
    def keep(self):
        """(B, H, Lq, Lk) bool: the pairs that mask_mod and causal leave."""
        f64 = torch.float64
        b, h, q, k = self.positions(f64)
        keep = torch.ones(self.B, self.H, self.Lq, self.Lk, dtype=torch.bool, device=self.dev)
        if self.causal:
            keep = keep & (k <= q + (self.Lk - self.Lq))
        if self.mask_fn is not None:
            m = self.mask_fn(None, b, h, q, k, self.T[f64], f64)
            keep = keep & (m if isinstance(m, torch.Tensor) else torch.full_like(keep, bool(m)))
        return keep

    def positions(self, dt):
        def ar(n, shape):
            return (torch.arange(n, device=self.dev, dtype=dt) + 1).view(shape)
        return (ar(self.B, (self.B, 1, 1, 1)), ar(self.H, (1, self.H, 1, 1)), ar(self.Lq, (1, 1, self.Lq, 1)),
                ar(self.Lk, (1, 1, 1, self.Lk)))

    def scores(self, work, grad=False):
        """(q, k, v, s, g): the inputs in `work` (k, v repeated over the
        query heads that share them), the scores scale QK^T through
        score_mod, and with grad their derivative by score_mod's s
        (torch.autograd; elementwise, so the gradient of the sum), else None."""
        G = self.H // self.Hkv
        q, k, v = self.inputs(work)
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        g = torch.ones_like(s) if grad else None
        if self.score_fn is not None:
            x = s.detach().requires_grad_(True) if grad else s
            b, h, qp, kp = self.positions(work)
            r = self.score_fn(x, b, h, qp, kp, self.T[work], work)
            r = r.expand_as(x) if isinstance(r, torch.Tensor) else torch.full_like(x, float(r))
            if grad:
                g = torch.autograd.grad(r.sum(), x)[0] if r.requires_grad else torch.zeros_like(s)
                r = r.detach()
            s = r
        return q, k, v, s, g

    def dense(self, work, low=None):
        """(o, lse, empty): the case's attention computed densely with
        arithmetic in `work`; with `low`, P and O are rounded to that dtype
        (a low-precision peer as FlashAttention's kernels compute: scores and
        their statistics in f32, P rounded for the PV product, O rounded)."""
        def rnd(x):
            return x.to(low).to(work) if low is not None else x
        _, _, v, s, _ = self.scores(work)
        keep = self.keep()
        s = s.masked_fill(~keep, -math.inf)
        lse = torch.logsumexp(s, dim=-1)
        empty = ~keep.any(dim=-1)
        p = torch.softmax(s, dim=-1).masked_fill(empty.unsqueeze(-1), 0.0)
        o = rnd(torch.matmul(rnd(p), v))
        return o, lse, empty

    def grads(self, work, low=None):
        """(dq, dk, dv) for the engine's dout, computed densely in `work`
        (the docstring's backward reference); with `low`, the gradients
        rounded to that dtype (the peer)."""
        G = self.H // self.Hkv
        q, kr, vr, s, g = self.scores(work, grad=True)
        dout = self.arrays["dout"].to(self.dev).to(self.lowp()).to(work)
        keep = self.keep()
        empty = ~keep.any(dim=-1, keepdim=True)
        s = s.masked_fill(~keep, -math.inf).masked_fill(empty, 0.0)
        p = torch.softmax(s, dim=-1).masked_fill(~keep, 0.0)
        o = torch.matmul(p, vr)
        if low is not None:  # the forward's output as the backward reads it: rounded to the dtype
            o = o.to(low).to(work)
        dp = torch.matmul(dout, vr.transpose(-1, -2))
        delta = (dout * o).sum(dim=-1, keepdim=True)
        ds = torch.where(keep, p * (dp - delta) * g, torch.zeros_like(p)) * self.scale
        if low is not None:  # the products' operands in the dtype, as PyTorch's autograd in that dtype has them
            p, ds = p.to(low).to(work), ds.to(low).to(work)
        dq = torch.matmul(ds, kr)
        B, Lk, D = self.B, self.Lk, self.D
        dk = torch.matmul(ds.transpose(-1, -2), q).view(B, self.Hkv, G, Lk, D).sum(dim=2)
        dv = torch.matmul(p.transpose(-1, -2), dout).view(B, self.Hkv, G, Lk, D).sum(dim=2)
        out = (dq, dk, dv)
        return tuple(x.to(low).to(work) for x in out) if low is not None else out

    # -- FlexAttention --
    def flex(self, dt, api):
        """(o, lse) from flex_attention with inputs in dtype dt."""
        flex_attention, create_block_mask, aux_request = api
        q, k, v = self.inputs(dt)
        score_mod = None
        if self.score_fn is not None:
            fn, T32, T64 = self.score_fn, self.T[torch.float32], self.T[torch.float64]

            def score_mod(score, b, h, q_idx, kv_idx):
                ed = torch.float64 if score.dtype == torch.float64 else torch.float32
                T = T64 if ed == torch.float64 else T32
                r = fn(score.to(ed), (b + 1).to(ed), (h + 1).to(ed), (q_idx + 1).to(ed), (kv_idx + 1).to(ed), T, ed)
                if not isinstance(r, torch.Tensor):
                    r = torch.full_like(score, float(r))
                return r.to(score.dtype)
        block_mask = None
        if self.mask_fn is not None or self.causal:
            mfn, T64, causal, shift = self.mask_fn, self.T[torch.float64], self.causal, self.Lk - self.Lq

            def mask_mod(b, h, q_idx, kv_idx):
                f64 = torch.float64
                r = True
                if mfn is not None:
                    r = mfn(None, (b + 1).to(f64), (h + 1).to(f64), (q_idx + 1).to(f64), (kv_idx + 1).to(f64), T64, f64)
                if causal:
                    cm = kv_idx <= q_idx + shift
                    r = cm if r is True else (cm & r)
                if not isinstance(r, torch.Tensor):
                    r = torch.full_like(q_idx, bool(r), dtype=torch.bool)
                return r
            block_mask = create_block_mask(mask_mod, self.B, self.H, self.Lq, self.Lk, device=self.dev)
        kw = dict(score_mod=score_mod, block_mask=block_mask, scale=self.scale, enable_gqa=self.H != self.Hkv)
        if aux_request is not None:
            out, aux = flex_attention(q, k, v, return_aux=aux_request(lse=True), **kw)
            lse = aux.lse
        else:
            out, lse = flex_attention(q, k, v, return_lse=True, **kw)
        return out, lse


def flex_api():
    """(flex_attention, create_block_mask, AuxRequest or None), or the reason it is missing."""
    try:
        from torch.nn.attention import flex_attention as mod
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:  # noqa: BLE001  (torch < 2.5, or a broken install)
        return None, f"{type(e).__name__}: {e}"
    aux = getattr(mod, "AuxRequest", None)
    try:
        params = inspect.signature(flex_attention).parameters
    except (TypeError, ValueError):
        params = {}
    if aux is not None and "return_aux" not in params:
        aux = None
    return (flex_attention, create_block_mask, aux), None


def maxabs(x):
    return x.abs().max().item() if x.numel() else 0.0


def judge(case, eng_o, eng_lse, ref, peer, empty):
    """(ok, why, numbers): the criterion of the docstring."""
    ref_o, ref_lse = ref
    peer_o, peer_lse = peer
    rows = ~empty.cpu()
    f64 = torch.float64
    eo, el = eng_o.to(f64), eng_lse.to(f64)
    ro, rl = ref_o.cpu().to(f64), ref_lse.cpu().to(f64)
    po, pl = peer_o.cpu().to(f64), peer_lse.cpu().to(f64)
    err = maxabs((eo - ro)[rows])
    err_peer = maxabs((po - ro)[rows])
    lerr = maxabs((el - rl)[rows])
    lerr_peer = maxabs((pl - rl)[rows])
    if case.dtype == "f32":
        slack, lslack = 1e-5, 1e-5 * max(1.0, maxabs(rl[rows]))
    else:
        slack, lslack = 1e-3, 1e-4
    limit, llimit = 2 * err_peer + slack, 2 * lerr_peer + lslack
    n = {"err": err, "err_peer": err_peer, "limit": limit, "lse_err": lerr, "lse_err_peer": lerr_peer,
         "lse_limit": llimit}
    why = []
    if not torch.isfinite(eo).all():
        why.append("NaN/inf in o")
    if not (err <= limit):
        why.append(f"o err {err:.3g} > limit {limit:.3g} (peer err {err_peer:.3g})")
    if not (lerr <= llimit):
        why.append(f"lse err {lerr:.3g} > limit {llimit:.3g} (peer err {lerr_peer:.3g})")
    if rows.any() and not torch.isfinite(el[rows]).all():
        why.append("an attending row's lse is not finite")
    if empty.any():
        e = empty.cpu()
        if not ((eo[e] == 0).all() and (el[e] == -math.inf).all()):
            why.append("a row with no key is not zeros with lse = -inf")
    return not why, "; ".join(why), n


def judge_grads(case, eng, ref, peer):
    """(ok, why, numbers): the backward's criterion of the docstring."""
    f64 = torch.float64
    n, why = {}, []
    for name, e, r, pe in zip(("dq", "dk", "dv"), eng, ref, peer):
        e, r, pe = e.cpu().to(f64), r.cpu().to(f64), pe.cpu().to(f64)
        err, err_peer, mag = maxabs(e - r), maxabs(pe - r), max(1.0, maxabs(r))
        limit = 2 * err_peer + (1e-5 if case.dtype == "f32" else 1e-3) * mag
        n.update({f"{name}_err": err, f"{name}_err_peer": err_peer, f"{name}_limit": limit})
        if not torch.isfinite(e).all():
            why.append(f"NaN/inf in {name}")
        elif not (err <= limit):
            why.append(f"{name} err {err:.3g} > limit {limit:.3g} (peer err {err_peer:.3g})")
    return not why, "; ".join(why), n


def self_check(case, dense64):
    """(ok, why, numbers): the dense f64 result against fa.attention_reference's."""
    o, lse, empty = (x.cpu() for x in dense64)
    ro, rl = case.arrays["ref_o"].to(torch.float64), case.arrays["ref_lse"].to(torch.float64)
    rows = ~empty
    err = maxabs(o - ro)
    lerr = maxabs((lse - rl)[rows])
    lscale = max(1.0, maxabs(rl[rows]))
    why = []
    if not (err <= 1e-8):
        why.append(f"dense f64 o differs from fa.attention_reference's by {err:.3g}")
    if not (lerr <= 1e-8 * lscale):
        why.append(f"dense f64 lse differs from fa.attention_reference's by {lerr:.3g}")
    if not torch.equal(rl == -math.inf, empty):
        why.append("dense f64 and fa.attention_reference disagree on the rows with no key")
    return not why, "; ".join(why), {"tree_err": err, "tree_lse_err": lerr}


def reason(e):
    """An exception's type and first line."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def run_case(c, folder, dev, api, use_flex):
    """One case's result (a dict)."""
    r = {k: c.get(k) for k in ("id", "name", "kind", "B", "H", "Hkv", "Lq", "Lk", "D", "dtype", "causal", "scale",
                               "kernel", "deterministic", "empty_rows")}
    r["score_mod"], r["mask_mod"] = c.get("lua_score_mod"), c.get("lua_mask_mod")
    if c.get("error"):
        return dict(r, ok=False, why=f"engine error: {c['error']}")
    case = Case(c, folder, dev)
    r["python"] = case.src
    f64, low = torch.float64, case.lowp()
    why, ok = [], True
    dense64 = case.dense(f64)
    empty = dense64[2]
    r["empty_rows_here"] = int(empty.sum().item())
    if "ref_o" in case.arrays:
        sok, swhy, sn = self_check(case, dense64)
        r.update(sn)
        if not sok:
            ok = False
            why.append(swhy)
    flexed = False
    if use_flex:
        importlib.import_module("torch._dynamo").reset()  # every case's functions are new: trace afresh
        try:
            try:
                ref_o, ref_lse = case.flex(f64, api)
                r["reference"] = "flex_f64"
            except Exception as e:  # noqa: BLE001  (a torch without f64 flex)
                r["flex_f64_refused"] = reason(e)
                ref_o, ref_lse = case.flex(torch.float32, api)
                r["reference"] = "flex_f32"
            peer = case.flex(low, api)
            r["peer"] = f"flex_{case.dtype}"
            flexed = True
        except Exception as e:  # noqa: BLE001  (judged against the dense references instead, and said so)
            r["flex_error"] = reason(e)
            if os.environ.get("ORACLE_TRACEBACK") == "1":
                import traceback
                traceback.print_exc()
            print(f"NOTE case {c['id']} {c.get('name')}: FlexAttention failed ({r['flex_error']}); "
                  "judged against the dense references", flush=True)
    if flexed:
        rows = ~empty
        agree = max(maxabs((ref_o.to(f64) - dense64[0])[rows]), maxabs((ref_lse.to(f64) - dense64[1])[rows]))
        r["flex_vs_dense"] = agree
        tol = 1e-8 if r["reference"] == "flex_f64" else 1e-4
        if not (agree <= tol):
            ok = False
            why.append(f"the references disagree: flex vs dense f64 {agree:.3g} (> {tol:g})")
        ref = (ref_o, ref_lse)
    else:
        ref = dense64[:2]
        r["reference"] = "dense_f64"
        peer = case.dense(torch.float32, None if case.dtype == "f32" else low)[:2]
        r["peer"] = f"dense_{case.dtype}"
    jok, jwhy, jn = judge(case, case.arrays["o"], case.arrays["lse"], ref, peer, empty)
    r.update(jn)
    if not jok:
        ok = False
        why.append(jwhy)
    if "dq" in case.arrays:  # the backward (API §10)
        eng = [case.arrays[x] for x in ("dq", "dk", "dv")]
        gok, gwhy, gn = judge_grads(case, eng, case.grads(f64),
                                    case.grads(torch.float32, None if case.dtype == "f32" else low))
        r.update(gn)
        r["backward_deterministic"] = c.get("backward_deterministic")
        if not gok:
            ok = False
            why.append(gwhy)
    if c.get("empty_rows") is not None and c["empty_rows"] != r["empty_rows_here"]:
        ok = False
        why.append(f"the engine has {c['empty_rows']} rows with lse = -inf, "
                   f"the mask leaves {r['empty_rows_here']} empty")
    return dict(r, ok=ok, why="; ".join(why))


def main():
    global torch, np
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Criterion and references: see the module docstring (pydoc or the file).")
    ap.add_argument("--dir", required=True, help="the folder scripts/oracle_variants.lua wrote (cases.json, .npy)")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    ap.add_argument("--commit", default=None, help="the commit measured (default: the one cases.json names)")
    ap.add_argument("--self-check", action="store_true",
                    help="no FlexAttention: the dense f64 reference and dense low-precision peer, and the dense f64 "
                         "result against the saved fa.attention_reference output (works on the CPU, any torch)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    a = ap.parse_args()
    import numpy as _np
    import torch as _torch
    torch, np = _torch, _np
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with open(os.path.join(a.dir, "cases.json")) as f:
        data = json.load(f)
    meta = data.get("meta") or {}
    cases = data.get("cases") or []
    api, missing = (None, "--self-check") if a.self_check else flex_api()
    use_flex = api is not None
    if not use_flex and not a.self_check:
        print(f"oracle_variants: FlexAttention unavailable ({missing}); the dense references are used", flush=True)
    if use_flex:
        import warnings
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
    t0 = time.time()
    results, fails, nondet = [], [], []
    for c in cases:
        try:
            r = run_case(c, a.dir, dev, api, use_flex)
        except Exception as e:  # noqa: BLE001  (the oracle's own fault: reported, the run goes on)
            if os.environ.get("ORACLE_TRACEBACK") == "1":
                import traceback
                traceback.print_exc()
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
            r = {"id": c.get("id"), "name": c.get("name"), "ok": False, "why": f"oracle error: {msg}",
                 "deterministic": c.get("deterministic")}
        if c.get("deterministic") is False:
            nondet.append(r["id"])
            print(f"NONDETERMINISTIC case {r['id']} {r.get('name')}", flush=True)
        if not r["ok"]:
            fails.append(r["id"])
            print(f"FAIL case {r['id']} {r.get('name')} ({c.get('dtype')}, B{c.get('B')} H{c.get('H')}/{c.get('Hkv')} "
                  f"L{c.get('Lq')}/{c.get('Lk')} D{c.get('D')}{' causal' if c.get('causal') else ''}): {r['why']}",
                  flush=True)
        results.append(r)
    secs = time.time() - t0
    refs = sorted({r.get("reference") for r in results if r.get("reference")})
    unchecked = [r["id"] for r in results if "tree_err" not in r and not str(r.get("why", "")).startswith("engine")]
    if unchecked:
        print(f"oracle_variants: {len(unchecked)} cases without fa.attention_reference's output in {a.dir} "
              "(--no-reference): the tree translations were not checked against it", flush=True)
    flex_errors = [r["id"] for r in results if r.get("flex_error")]
    if flex_errors:
        print(f"oracle_variants: FlexAttention failed on {len(flex_errors)} cases ({flex_errors}): judged against "
              "the dense references", flush=True)
    print(f"oracle_variants: {len(cases)} cases, {len(fails)} failures, {len(nondet)} not bit-identical "
          f"({secs:.0f} s, reference {', '.join(refs) or '-'}, device {dev})", flush=True)
    if a.json:
        gpu = torch.cuda.get_device_name() if dev.startswith("cuda") and torch.cuda.is_available() else None
        out = {
            "meta": {
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "gpu": gpu, "device": dev, "torch": torch.__version__,
                "commit": a.commit or meta.get("commit") or "unknown",
                "command": " ".join(sys.argv), "dir": a.dir, "mode": "self-check" if a.self_check else "oracle",
                "flexattention": None if use_flex else (missing or "unavailable"),
                "references": refs, "seconds": round(secs, 1),
                "criterion": "over rows that attend a key: max|o-ref| <= 2 max|o_peer-ref| + (1e-5 f32, "
                             "1e-3 bf16/f16); max|lse-ref| <= 2 max|lse_peer-ref| + (1e-5 max(1,|lse|) f32, 1e-4 "
                             "bf16/f16); ref the f64 reference (flex, else dense), peer the same in the case's dtype; "
                             "empty rows exact zeros with lse -inf; two engine calls bit-identical; dense f64 vs "
                             "fa.attention_reference 1e-8; flex f64 vs dense f64 1e-8; gradients: max|g-ref| <= "
                             "2 max|g_peer-ref| + (1e-5 f32, 1e-3 bf16/f16) max(1,|ref|), g_peer dense in f32 with o, "
                             "P and dS rounded to the dtype (the operands of the products) and g rounded",
                "engine": meta,
            },
            "cases": len(cases), "failures": len(fails), "not_bit_identical": len(nondet),
            "failed": fails, "nondeterministic": nondet, "flex_errors": flex_errors,
            "without_reference_output": unchecked, "results": results,
        }
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    sys.exit(1 if fails or nondet else 0)


if __name__ == "__main__":
    main()
