"""scripts/cubin_loops.py on synthetic cubins: ELF64 files whose .text.NAME sections hold instructions made
the way the script reads them (the operation in the low 12 bits, a BRA's offset in bits 16-23 and 34-73)."""
import os
import struct
import sys
import tempfile

from sass_listing import ScriptTest

T = ScriptTest("cubin_loops.py")
sys.path.insert(0, os.path.dirname(T.script))
import cubin_loops  # noqa: E402

CODE = {"R2UR": 0x2ca, "HGMMA": 0xdf0, "HMMA": 0x23c, "MUFU": 0x308, "BRA": 0x947, "BSSY": 0x945, "FFMA": 0x223}


def insn(op, target=None, at=None):
    """16 bytes of one instruction; a BRA at index `at` to index `target`."""
    word = CODE[op]
    if op == "BRA":
        v = ((target - at - 1) * 4) & ((1 << 48) - 1)
        word |= (v & 0xff) << 16 | (v >> 8) << 34
    return struct.pack("<QQ", word & (2**64 - 1), word >> 64)


def code(ops):
    """ops: mnemonics, or ("BRA", target) for a branch."""
    return b"".join(insn(o[0], o[1], i) if isinstance(o, tuple) else insn(o) for i, o in enumerate(ops))


def elf(texts):
    """An ELF64 file with a section .text.NAME for each (NAME, bytes) and the section names' table."""
    names = [b""] + [b".text." + n.encode() for n, _ in texts] + [b".shstrtab"]
    strtab = b"\0".join(names) + b"\0"
    offs = [sum(len(x) + 1 for x in names[:i]) for i in range(len(names))]
    body, place = b"", []
    for _, t in texts:
        place.append((64 + len(body), len(t)))
        body += t
    place.append((64 + len(body), len(strtab)))
    body += strtab
    shoff = 64 + len(body)
    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 64, len(names), len(names) - 1)
    sh = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    for i, (off, size) in enumerate(place):
        sh += struct.pack("<IIQQQQIIQQ", offs[i + 1], 1, 0, 0, off, size, 0, 0, 1, 0)
    return bytes(head) + body + sh


# the branch's encoding round-trips, backwards and forwards
for at, target in ((40, 3), (7, 7), (2, 90)):
    lo, hi = struct.unpack("<QQ", insn("BRA", target, at))
    got = cubin_loops.branch_target(at, hi << 64 | lo)
    T.expect(f"BRA at {at} to {target}", got == target, str(got))

# a key loop [2, 9] with two R2UR and a product inside a longer span (an out-of-line wait loop's back edge), an
# R2UR outside both; a function with no loop
key = ["FFMA", "R2UR", "BSSY", "HGMMA", "R2UR", "R2UR", "MUFU", "FFMA", "FFMA", ("BRA", 2), "FFMA", "FFMA",
       ("BRA", 1), "FFMA"]
flat = ["R2UR", "FFMA", "MUFU"]
r = cubin_loops.report(code(key))
T.expect("key loop span", r["loop"] and (r["loop"]["first"], r["loop"]["last"]) == (2, 9), str(r))
T.expect("key loop counts", r["loop"] and (r["loop"]["r2ur"], r["loop"]["products"], r["loop"]["mufu"],
                                           r["loop"]["bssy"]) == (2, 1, 1, 1), str(r))
T.expect("function counts", (r["instructions"], r["r2ur"]) == (14, 3), str(r))
r = cubin_loops.report(code(flat))
T.expect("no loop", r["loop"] is None, str(r))
# a short loop of exponentials alone (an epilogue's) is not the key loop where one holds products
r = cubin_loops.report(code(key + ["MUFU", "FFMA", ("BRA", 14)]))
T.expect("products first", r["loop"] and (r["loop"]["first"], r["loop"]["last"]) == (2, 9), str(r))
r = cubin_loops.report(code(["FFMA", "MUFU", ("BRA", 1), "MUFU", "FFMA", "FFMA", ("BRA", 3)]))
T.expect("exponentials without products", r["loop"] and (r["loop"]["first"], r["loop"]["last"]) == (1, 2), str(r))
# mma.sync's products count as products (the sm_80 kernels: decode at Lq = 1, the mma forward)
r = cubin_loops.report(code(["FFMA", "HMMA", "HMMA", "MUFU", ("BRA", 1), "MUFU", ("BRA", 5)]))
T.expect("HMMA", r["loop"] and (r["loop"]["first"], r["loop"]["products"]) == (1, 2), str(r))
# a loop without products or exponentials is not a key loop
T.expect("plain loop", cubin_loops.report(code(["FFMA", "FFMA", ("BRA", 0)]))["loop"] is None)

with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(elf([("kern_a", code(key)), ("kern_b", code(flat))]))
try:
    out = T.call(f.name)
    lines = out.stdout.splitlines()
    T.expect("run: status", out.returncode == 0, out.stdout + out.stderr)
    row = next((x for x in lines if x.endswith("kern_a")), "")
    T.expect("run: kern_a's row", row.split()[:7] == ["14", "3", "|", "8", "2", "1", "1"], out.stdout)
    row = next((x for x in lines if x.endswith("kern_b")), "")
    T.expect("run: kern_b's row", row.split()[:4] == ["3", "1", "|", "-"], out.stdout)
    out = T.call(f.name, "kern_b")
    T.expect("run: filter", "kern_b" in out.stdout and "kern_a" not in out.stdout, out.stdout)
finally:
    os.unlink(f.name)
out = T.call()
T.expect("usage", out.returncode != 0 and "usage" in out.stderr, out.stdout + out.stderr)
T.finish("test_cubin_loops")
