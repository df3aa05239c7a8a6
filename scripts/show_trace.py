#!/usr/bin/env python3
"""Block 0's cycle marks from a trace build (kernels/ptx/trace.cuh), read from the output of
scripts/probe_trace.lua (or any program on such a build): each launch's marks in kilocycles from
warpgroup 0's first mark, then the consumers' phases averaged over the query tiles after the first.
Consumer marks (attention_wgmma_tma.cuh): 0 tile taken, 1 Q in, 2 first S in, 3 key loop done,
4 last P.V done, 5 NaN/inf check done, 7 O staged, 6 O stored; producer (wg2): 0 loop top, 1 tile taken,
2 slot posted, 3 Q issued, 4 every copy issued.  A mark never reached shows as '-'.
Usage: build-trace/flashattn-lua scripts/probe_trace.lua ... | python3 scripts/show_trace.py [--all]
(--all: every launch; default: the last one, a warm call)."""
import argparse
import re
import sys

# (name, start marks in order of preference, end mark): mark 5 is the persistent form's NaN/inf check of
# the outputs done (the one-tile form's staging barrier until 2026-11-30), 7 its O staged in O's tile; O's
# store starts at the latest of 7, 5 and 4 that the kernel marks
PHASES = [("Q wait", (0,), 1), ("first S", (1,), 2), ("key loop", (2,), 3), ("last P.V", (3,), 4),
          ("NaN check", (4,), 5), ("O staged", (5, 4), 7), ("O store", (7, 5, 4), 6)]


def parse(lines):
    launches = []
    for line in lines:
        m = re.match(r"TRACE wg(\d+) n(\d+) (.*)", line)
        if m:
            if not launches:
                launches.append({"kernel": "?", "marks": {}})
            launches[-1]["marks"][(int(m.group(1)), int(m.group(2)))] = [int(x) for x in m.group(3).split()]
        elif line.startswith("TRACE "):
            launches.append({"kernel": line.split(None, 1)[1].strip(), "marks": {}})
    return launches


def show(launch):
    marks = launch["marks"]
    if (0, 0) not in marks or not marks[(0, 0)][0]:
        print(f"{launch['kernel']}: no marks of warpgroup 0")
        return
    base = marks[(0, 0)][0]
    print(f"{launch['kernel']} (kilocycles from warpgroup 0's first mark)")
    tiles = sorted({n for _, n in marks})
    for n in tiles:
        for w in sorted({w for w, _ in marks}, key=lambda w: (w != 2, w)):
            if (w, n) in marks:
                row = " ".join(f"{(c - base) / 1000:8.2f}" if c else "       -" for c in marks[(w, n)])
                print(f"  n{n} wg{w}: {row}")
    # the consumers' phases, tiles 1.. (tile 0 includes the start), and a tile's length
    sums, counts = {}, {}
    for (w, n), c in marks.items():
        if w == 2 or n == 0:
            continue
        for name, starts, b in PHASES:
            lo = next((c[a] for a in starts if c[a]), 0)
            if lo and c[b]:
                sums[name] = sums.get(name, 0) + c[b] - lo
                counts[name] = counts.get(name, 0) + 1
        nxt = marks.get((w, n + 1))
        if nxt and nxt[0] and c[0]:
            sums["a whole tile"] = sums.get("a whole tile", 0) + nxt[0] - c[0]
            counts["a whole tile"] = counts.get("a whole tile", 0) + 1
    if sums:
        print("  consumers, mean over the tiles after the first: " +
              ", ".join(f"{k} {sums[k] / counts[k] / 1000:.2f}k" for k in [p[0] for p in PHASES] + ["a whole tile"]
                        if k in sums))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="every launch, not only the last")
    args = ap.parse_args()
    launches = parse(sys.stdin.read().splitlines())
    if not launches:
        print("show_trace.py: no TRACE lines (a build with -DFLASHATTN_KERNEL_TRACE=ON prints them)")
        return 1
    for launch in launches if args.all else launches[-1:]:
        show(launch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
