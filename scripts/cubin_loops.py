#!/usr/bin/env python3
"""Each kernel's key loop read from a cubin, with no cuobjdump (this machine's CUDA toolkit has nvcc and ptxas
alone): the instruction count of every function of an sm_90a cubin, its R2UR, and its innermost loop that holds
tensor-core products or exponentials, with that loop's R2UR.  An R2UR in a key loop moves a per-thread value to
the uniform datapath, mostly a wgmma descriptor made from a base that ptxas keeps in a per-thread register; read
through a shuffle (a value it knows is warp-uniform), the base stays uniform (sessions 96-98, docs/perf/README.md).

  nvcc -O3 -DNDEBUG -DFA_HAVE_CUDA -std=c++17 --options-file BUILD/CMakeFiles/flashattn_objects.dir/includes_CUDA.rsp \
    -arch=sm_90a -cubin kernels/attention/UNIT.cu -o A.cubin
  python3 scripts/cubin_loops.py A.cubin [FILTER]     # FILTER: a substring of the (mangled) function names

How it reads SASS: an instruction is 16 bytes; the low 12 bits of its first word name the operation (the codes
below, read off `cuobjdump -sass` listings of the same cubins on the device).  A BRA's signed offset is bits 16-23
and 34-73 of the instruction (48 bits, in units of a quarter instruction, from the next one): a branch to an
earlier instruction closes a loop.  Out-of-line wait loops (an mbarrier's try_wait) also branch back across the
code between them, so a loop here is a back edge's span; the key loop is the shortest span holding products (in a
kernel without any, the shortest holding exponentials: a producer's or an epilogue's loop is no key loop).
"""
import collections
import os
import signal
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cubin_cmp import sections  # noqa: E402

OPS = {0x2ca: "R2UR", 0xdf0: "HGMMA", 0x9f0: "HGMMA", 0xdf3: "QGMMA", 0x9f3: "QGMMA", 0x23c: "HMMA", 0x308: "MUFU",
       0x947: "BRA", 0x945: "BSSY"}
# (HMMA, mma.sync m16n8k16: its code read off counts, the mma forward's key tile 128 at D = 128 and 64 at D = 64)
PRODUCTS = ("HGMMA", "QGMMA", "HMMA")


def decode(text):
    """The operations of a .text section: (mnemonic or None, the 128-bit instruction) each."""
    out = []
    for i in range(len(text) // 16):
        lo, hi = struct.unpack_from("<QQ", text, 16 * i)
        out.append((OPS.get(lo & 0xfff), (hi << 64) | lo))
    return out


def branch_target(i, word):
    """The index a BRA at index i jumps to."""
    v = ((word >> 16) & 0xff) | (((word >> 34) & ((1 << 40) - 1)) << 8)
    if v >> 47:
        v -= 1 << 48
    return i + 1 + v // 4


def loops(ins):
    """(first, last) index of every back edge's span."""
    return [(t, i) for i, (m, w) in enumerate(ins) if m == "BRA" for t in [branch_target(i, w)] if t <= i]


def report(text):
    """A function's figures: instructions, R2UR, and its key loop's (None where it has none)."""
    ins = decode(text)
    best = None  # the shortest span with products; without any, the shortest with exponentials (SIMT kernels)
    for t, i in loops(ins):
        c = collections.Counter(m for m, _ in ins[t:i + 1])
        products = sum(c[m] for m in PRODUCTS)
        key = (0 if products else 1, i - t)
        if (products or c["MUFU"]) and (best is None or key < best[0]):
            best = (key, t, i, products, c)
    loop = None
    if best:
        _, t, i, products, c = best
        loop = {"first": t, "last": i, "instructions": i - t + 1, "r2ur": c["R2UR"], "products": products,
                "mufu": c["MUFU"], "bssy": c["BSSY"]}
    return {"instructions": len(ins), "r2ur": sum(1 for m, _ in ins if m == "R2UR"), "loop": loop}


def main():
    if len(sys.argv) not in (2, 3) or not sys.argv[1].endswith(".cubin"):
        sys.exit("usage: cubin_loops.py A.cubin [FILTER]")
    filt = sys.argv[2] if len(sys.argv) == 3 else ""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # (into head: no traceback)
    print(f"{'insts':>6} {'R2UR':>5} | {'loop':>5} {'R2UR':>5} {'MMA':>4} {'MUFU':>5} {'BSSY':>5}  function")
    for name, text in sorted(sections(sys.argv[1]).items()):
        if not name.startswith(".text.") or filt not in name:
            continue
        r, fn = report(text), name[len(".text."):]
        lp = r["loop"]
        cols = (f"{lp['instructions']:5d} {lp['r2ur']:5d} {lp['products']:4d} {lp['mufu']:5d} {lp['bssy']:5d}" if lp
                else f"{'-':>5} {'-':>5} {'-':>4} {'-':>5} {'-':>5}")
        print(f"{r['instructions']:6d} {r['r2ur']:5d} | {cols}  {fn}")


if __name__ == "__main__":
    main()
