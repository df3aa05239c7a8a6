#!/usr/bin/env python3
"""The key loops of a library's kernels, from their SASS (cuobjdump -sass;
on the GPU machine, which has it): for each function, the innermost loop
that holds tensor-core products (HGMMA or HMMA), with its instruction count
and the instructions that betray per-thread work ptxas could not keep on
the uniform datapath: R2UR (a per-thread value moved to a uniform register,
as a descriptor or barrier address needs), and the divergence guards BSSY,
BRA.DIV and WARPSYNC.

Session 96 found a trial's key loop at 824 instructions with 24 R2UR and a
divergence guard where main's had 797 and none: its bound came from
per-thread values, and D = 64's forward ran 10-14 % slower
(docs/perf/2026-12-07-diag-half-tile-tried-h100.json).  This lists every
kernel's loop in one table, so that such a loop shows without a benchmark.

  python3 scripts/sass_loop_report.py LIB_OR_CUBIN... [--filter SUBSTRING] [--json FILE] [--cuobjdump PATH]
  python3 scripts/sass_loop_report.py --sass FILE [...]
"""
import argparse
import collections
import json
import re

from sass_uniform_check import functions, listing_arguments, listings, unpredicated

BRANCH = re.compile(r"\bBRA(?:\.\w+)* (?:\S+, )?(0x[0-9a-f]+)")
PRODUCT = re.compile(r"^(HGMMA|HMMA)")
WATCH = ("R2UR", "BSSY", "BRA.DIV", "WARPSYNC", "MUFU.EX2", "HGMMA", "HMMA", "BAR", "SYNCS")


def opcode(text):
    return unpredicated(text).split()[0]


def key_loop(insns):
    """(first, last) address of the smallest loop (a backward branch's span)
    that holds a tensor-core product and an exponential (the softmax), else
    of the smallest that holds a product; None without one.  (A retry stub
    of an mbarrier wait, placed after the code, branches back into it: its
    span can hold a product but rarely the whole softmax.)"""
    ops = [(a, opcode(t)) for a, t in insns]
    products = [a for a, op in ops if PRODUCT.match(op)]
    exps = [a for a, op in ops if op == "MUFU.EX2"]
    best, best_exp = None, None
    for a, t in insns:
        m = BRANCH.search(t)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= a or not any(target <= p <= a for p in products):
            continue
        if best is None or a - target < best[1] - best[0]:
            best = (target, a)
        if any(target <= e <= a for e in exps) and (best_exp is None or a - target < best_exp[1] - best_exp[0]):
            best_exp = (target, a)
    return best_exp or best


def report(name, insns):
    span = key_loop(insns)
    if span is None:
        return None
    body = [opcode(t) for a, t in insns if span[0] <= a <= span[1]]
    count = collections.Counter()
    for op in body:
        for w in WATCH:
            if op == w or op.startswith(w + "."):
                count[w] += 1
    return {"function": name, "loop": [hex(span[0]), hex(span[1])], "instructions": len(body),
            **{w: count[w] for w in WATCH}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    listing_arguments(ap)
    ap.add_argument("--json", help="write the rows to this file")
    a = ap.parse_args()
    rows = []
    for lines in listings(ap, a):
        for name, insns in functions(lines, addresses=True):
            row = report(name, insns) if a.filter in name else None
            if row:
                rows.append(row)
    print(f"{'instr':>6} {'R2UR':>5} {'BSSY':>5} {'DIV':>4} {'WSYNC':>5} {'EX2':>5} {'HGMMA':>6} {'HMMA':>5}  function")
    for r in rows:
        print(f"{r['instructions']:6d} {r['R2UR']:5d} {r['BSSY']:5d} {r['BRA.DIV']:4d} {r['WARPSYNC']:5d} "
              f"{r['MUFU.EX2']:5d} {r['HGMMA']:6d} {r['HMMA']:5d}  {r['function']}")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
