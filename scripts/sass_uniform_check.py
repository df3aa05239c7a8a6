#!/usr/bin/env python3
"""Flags uniform registers that a kernel reads and never writes, in the SASS
of a library or cubin (cuobjdump -sass; on the GPU machine, which has it).

CUDA 13.0's ptxas has twice left the cache-policy descriptor of cp.async
copies (LDGSTS ... desc[URn]) in uniform registers that nothing in the
kernel sets: an illegal instruction on the device, for only the calls
that reach those copies (the decode kernel's evict-first copies:
docs/perf/2026-12-01-decode-stream-tried-h200.json, and session 75's
docs/perf/2026-12-04-decode-illegal-instruction-epilogue-h200.json).  Every read register must have a write somewhere in
the function; a read with none is such a miscompile.

  python3 scripts/sass_uniform_check.py LIB_OR_CUBIN... [--filter SUBSTRING]
  python3 scripts/sass_uniform_check.py --sass FILE     (cuobjdump -sass output)

Exit status 1 when a function reads a register it never writes."""
import argparse
import re
import subprocess
import sys

FUNC = re.compile(r"^\s*Function : (\S+)")
INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
UREG = re.compile(r"\bUR(\d+)\b")


def width(op):
    """Registers a destination spans, from the opcode's size suffix."""
    if ".128" in op:
        return 4
    if ".64" in op or ".WIDE" in op:
        return 2
    return 1


def unpredicated(text):
    """An instruction's text without its guard predicate (@P0, @!UP1 ...)."""
    return re.sub(r"^@!?U?P\w+\s+", "", text)


def check_function(name, insns):
    """(register, instruction) for each uniform register read and never written."""
    written, reads = set(), []
    for text in insns:
        body = unpredicated(text)
        parts = body.split(None, 1)
        op, args = parts[0], (parts[1] if len(parts) > 1 else "")
        ops = [a.strip() for a in args.split(",")]
        first = UREG.fullmatch(ops[0]) if ops and ops[0] else None
        rest = ops[1:] if first else ops
        if first:
            n = int(first.group(1))
            written.update(range(n, n + width(op)))
        # (HGMMA's gdesc[URn] holds A's descriptor in n, n + 1 and B's in n + 2, n + 3; with A in registers,
        # an R operand between the destination and it, only B's is read)
        g = next((i for i, x in enumerate(ops) if x.startswith("gdesc[")), -1)
        a_in_regs = g >= 2 and re.fullmatch(r"R\d+", ops[g - 1]) is not None
        for a in rest:
            for m in re.finditer(r"(g?)desc\[UR(\d+)\]", a):
                n = int(m.group(2))
                regs = (n + 2, n + 3) if m.group(1) and a_in_regs else (n, n + 1, n + 2, n + 3) if m.group(1) else (n, n + 1)
                reads.extend((r, text) for r in regs)
            for m in UREG.finditer(re.sub(r"g?desc\[UR\d+\]", "", a)):
                reads.append((int(m.group(1)), text))
    return [(n, t) for n, t in reads if n not in written]


def functions(lines, addresses=False):
    """(name, instructions) for each function of a cuobjdump -sass listing;
    with addresses, each instruction as (address, text)."""
    name, insns = None, []
    for line in lines:
        m = FUNC.match(line)
        if m:
            if name:
                yield name, insns
            name, insns = m.group(1), []
            continue
        m = INSN.match(line)
        if m and name:
            insns.append((int(m.group(1), 16), m.group(2).strip()) if addresses else m.group(2).strip())
    if name:
        yield name, insns


def listing_arguments(ap):
    """A listing reader's arguments: libraries or cubins, --sass, --filter, --cuobjdump."""
    ap.add_argument("files", nargs="*", help="libraries or cubins, disassembled by cuobjdump -sass")
    ap.add_argument("--sass", action="append", default=[], help="a cuobjdump -sass listing already made")
    ap.add_argument("--filter", default="", help="only functions whose mangled name holds this")
    ap.add_argument("--cuobjdump", default="cuobjdump")


def listings(ap, a):
    """The lines of each listing listing_arguments named: the --sass files, then the libraries and
    cubins disassembled; none is a usage error."""
    if not a.files and not a.sass:
        ap.error("give a library, a cubin or --sass")
    out = [open(f, errors="replace").read().splitlines() for f in a.sass]
    for f in a.files:
        out.append(subprocess.run([a.cuobjdump, "-sass", f], check=True, capture_output=True, text=True).stdout.splitlines())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    listing_arguments(ap)
    a = ap.parse_args()
    checked, bad = 0, 0
    for lines in listings(ap, a):
        for name, insns in functions(lines):
            if a.filter not in name:
                continue
            checked += 1
            missing = check_function(name, insns)
            if missing:
                bad += 1
                regs = sorted({n for n, _ in missing})
                print(f"UNSET {name}: reads UR{', UR'.join(map(str, regs))} never written, e.g. {missing[0][1]}")
    print(f"sass_uniform_check: {checked} functions, {bad} reading uniform registers never written")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
