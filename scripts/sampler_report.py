#!/usr/bin/env python3
"""Self and inclusive shares by function of a scripts/sampler.c profile.
Frames in --exe are named by addr2line on --binary (the same build, here),
and so are those of each --map DEVICEPATH=LOCALPATH (a shared library of the
same build: a carried build's libflashattn*.so); other libraries by name.  Only samples with a frame
whose name contains --within count (the loop measured, not start-up).
  python3 scripts/sampler_report.py prof.txt --exe /path/on/device/bg/flashattn-lua \\
      --binary build/flashattn-lua --within attention [--callers cudaFreeAsync]"""
import argparse
import collections
import subprocess


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--exe", required=True, help="the profiled executable's path as /proc/self/maps shows it")
    ap.add_argument("--binary", required=True, help="the same executable here, for addr2line")
    ap.add_argument("--map", action="append", default=[], metavar="DEVICEPATH=LOCALPATH",
                    help="a library's path in the profile and the same file here, for addr2line (repeatable)")
    ap.add_argument("--within", default="", help="count only samples with a frame whose name contains this")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--callers", nargs="*", default=[], help="functions whose callers to list")
    a = ap.parse_args()
    head, _, tail = open(a.profile).read().partition("\nMAPS\n")
    # a null frame is 0 (profiles written with %p have it as "(nil)")
    samples = [[0 if x == "(nil)" else int(x, 16) for x in line.split()]
               for line in head.split("\n") if line.strip()]
    maps = []
    for line in tail.split("\n"):
        p = line.split()
        if len(p) >= 6:
            lo, hi = (int(x, 16) for x in p[0].split("-"))
            maps.append((lo, hi, int(p[2], 16), p[5]))
    base = {}
    for lo, _, off, path in maps:
        if off == 0 and path not in base:
            base[path] = lo

    def module(x):
        for lo, hi, _, path in maps:
            if lo <= x < hi:
                return path
        return "?"

    local = {a.exe: a.binary}
    for m in a.map:
        dev, sep, here = m.partition("=")
        if not sep:
            ap.error(f"--map: expected DEVICEPATH=LOCALPATH, got '{m}'")
        local[dev] = here
    names = {}
    for dev, here in local.items():
        addrs = sorted({x for s in samples for x in s if module(x) == dev})
        if addrs:  # return addresses: the call is the byte before
            out = subprocess.run(["addr2line", "-f", "-C", "-e", here] + [hex(x - base[dev] - 1) for x in addrs],
                                 capture_output=True, text=True, check=True).stdout.split("\n")
            names.update({x: out[2 * i] for i, x in enumerate(addrs)})

    def name(x):
        m = module(x)
        return names.get(x, "?") if m in local else m.rsplit("/", 1)[-1].split(".so")[0]

    kept = []
    for s in samples:
        fr = [name(x) for x in s]
        # the handler (sampler.so) and the signal's trampoline (libc) come first
        cut = next((i for i, f in enumerate(fr[:4]) if f == "libc"), -1)
        fr = fr[cut + 1:]
        if fr and (not a.within or any(a.within in f for f in fr)):
            kept.append(fr)
    n = max(len(kept), 1)
    leaf, incl = collections.Counter(), collections.Counter()
    for fr in kept:
        leaf[fr[0]] += 1
        for f in set(fr):
            incl[f] += 1
    print(f"{len(kept)} samples of {len(samples)} within '{a.within}'")
    print("--- self")
    for f, c in leaf.most_common(a.top):
        print(f"{100 * c / n:5.1f}% {f}")
    print("--- inclusive")
    for f, c in incl.most_common(a.top):
        print(f"{100 * c / n:5.1f}% {f}")
    for target in a.callers:
        chains = collections.Counter()
        for fr in kept:
            if target in fr:
                i = fr.index(target)
                chains[" <- ".join(fr[i:i + 4])] += 1
        print(f"--- callers of {target}")
        for chain, c in chains.most_common(6):
            print(f"{100 * c / n:5.1f}% {chain}")


if __name__ == "__main__":
    main()
