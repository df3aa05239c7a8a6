#!/usr/bin/env python3
"""A kernel's block timeline from a trace build (kernels/ptx/trace.cuh's TIMELINE lines: each block's SM and
its globaltimer at marks 0-3, or 0-7), read from the output of scripts/probe_trace.lua --backward (or any
program on such a build): for the last launch (or every one with --all), the blocks' median time, the shares
of the blocks' time between marks 0-1, 1-2 and 2-3 (the fused backward's: start to first tile, key loop, dK/dV
stores), the start's own phases where the blocks carry marks 4-7 (START_PHASES), the gaps between consecutive
blocks on an SM, and the SMs' idle time before their first block and after their last, as shares of SM-time
over the launch's span (first mark to last).
Usage: build-trace/flashattn-lua scripts/probe_trace.lua --backward | python3 scripts/show_timeline.py [--all]"""
import argparse
import re
import statistics
import sys

PHASES = [("start to first tile", 0, 1), ("key loop", 1, 2), ("stores", 2, 3)]
# the fused backward's marks 4-7 (kernels/attention/attention_backward_wgmma.cuh), in time order between 0 and 1
START_PHASES = [("barrier inits", 0, 4), ("indices, K/V issued", 4, 5), ("query-tile search", 5, 6),
                ("until K/V landed", 6, 7), ("until the first tile", 7, 1)]


def parse(lines):
    launches = []
    for line in lines:
        m = re.match(r"TIMELINE (\d+) (\d+)((?: \d+){4}|(?: \d+){8})\s*$", line)
        if m and launches:
            launches[-1]["blocks"].append({"sm": int(m.group(2)), "t": [int(x) for x in m.group(3).split()]})
            continue
        m = re.match(r"TIMELINE (\S+) (\d+)\s*$", line)
        if m:
            launches.append({"kernel": m.group(1), "blocks": []})
    return launches


def summary(launch):
    """The launch's figures as a dict (None when no block reached its last mark)."""
    blocks = [b for b in launch["blocks"] if all(b["t"][:4])]
    if not blocks:
        return None
    t0, t1 = min(b["t"][0] for b in blocks), max(b["t"][3] for b in blocks)
    span = t1 - t0
    total = sum(b["t"][3] - b["t"][0] for b in blocks)
    out = {"kernel": launch["kernel"], "blocks": len(blocks), "span_us": span / 1e3,
           "block_median_us": statistics.median(b["t"][3] - b["t"][0] for b in blocks) / 1e3}
    for name, a, z in PHASES:
        d = [b["t"][z] - b["t"][a] for b in blocks]
        out[name] = (statistics.median(d) / 1e3, sum(d) / total if total else 0.0)
    marked = [b for b in blocks if len(b["t"]) == 8 and all(b["t"])]  # the start's marks (a 0: not reached)
    out["start"] = [(name, statistics.median(b["t"][z] - b["t"][a] for b in marked) / 1e3)
                    for name, a, z in START_PHASES] if marked else []
    per_sm = {}
    for b in blocks:
        per_sm.setdefault(b["sm"], []).append(b["t"])
    gaps = head = tail = 0
    for ts in per_sm.values():
        ts.sort()
        head += ts[0][0] - t0
        tail += t1 - ts[-1][3]
        gaps += sum(max(0, c[0] - p[3]) for p, c in zip(ts, ts[1:]))
    sm_time = len(per_sm) * span if span else 1
    out.update(sms=len(per_sm), gaps=gaps / sm_time, head=head / sm_time, tail=tail / sm_time)
    return out


def show(s):
    print(f"{s['kernel']}: {s['blocks']} blocks on {s['sms']} SMs, span {s['span_us']:.1f} us, "
          f"a block {s['block_median_us']:.2f} us (median)")
    for name, _, _ in PHASES:
        med, share = s[name]
        print(f"  {name:<20} {med:8.2f} us (median)  {100 * share:5.1f} % of the blocks' time")
        if name == PHASES[0][0]:
            for sub, sub_med in s["start"]:
                print(f"    {sub:<22} {sub_med:6.2f} us (median)")
    print(f"  SM-time idle: between blocks {100 * s['gaps']:.1f} %, before the first {100 * s['head']:.1f} %, "
          f"after the last {100 * s['tail']:.1f} %")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every launch, not only the last")
    args = ap.parse_args()
    launches = parse(sys.stdin)
    if not launches:
        print("show_timeline.py: no TIMELINE lines in the input (a build with -DFLASHATTN_KERNEL_TRACE=ON prints them)")
        return 1
    shown = 0
    for launch in launches if args.all else launches[-1:]:
        s = summary(launch)
        if s is None:
            print(f"{launch['kernel']}: no block reached its last mark")
        else:
            show(s)
            shown += 1
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main())
