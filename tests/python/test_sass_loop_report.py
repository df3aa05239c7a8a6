"""scripts/sass_loop_report.py on synthetic cuobjdump -sass listings: the key loop is the smallest
backward branch's span holding a product and an exponential (not a retry stub's branch back into
it, which holds a product alone), its R2UR and divergence guards are counted, a function without a
product is left out, --filter keeps to matching names, --json writes the rows, and no listing is an
error."""
import json
import os
import tempfile

from sass_listing import ScriptTest, listing

t = ScriptTest("sass_loop_report.py")


# 0x0000 prologue; the loop 0x0010 .. 0x0090 (its branch back at 0x0090); after it a retry stub at
# 0x00b0 that branches back to 0x0070, a shorter span holding the second product but no exponential
loop = listing("_Z4loopv", [
    "MOV R1, RZ",                                           # 0x00
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",         # 0x10 loop head
    "@!P0 BRA 0xb0",                                        # 0x20
    "R2UR UR20, R10",                                       # 0x30
    "HGMMA.64x128x16.F32.BF16 R24, R152, gdesc[UR20], RZ",  # 0x40
    "MUFU.EX2 R5, R6",                                      # 0x50
    "BSSY B0, 0x80",                                        # 0x60
    "HGMMA.64x64x16.F32.BF16 R88, R120, gdesc[UR20], R88",  # 0x70
    "ISETP.NE.AND P1, PT, R3, R4, PT",                      # 0x80
    "@P1 BRA 0x10",                                         # 0x90 loop back
    "EXIT",                                                 # 0xa0
    "BRA 0x70",                                             # 0xb0 the retry stub's way back
])
plain = listing("_Z5plainv", ["MOV R1, RZ", "EXIT"])

rc, out = t.run(loop)
row = [l for l in out.splitlines() if "_Z4loopv" in l]
t.expect("one row for the loop", rc == 0 and len(row) == 1, out)
if row:
    f = row[0].split()
    # instr R2UR BSSY DIV WSYNC EX2 HGMMA HMMA
    t.expect("the loop's span is 0x10 .. 0x90 (9 instructions)", f[0] == "9", out)
    t.expect("one R2UR, one BSSY, one exponential, two products", f[1:8] == ["1", "1", "0", "0", "1", "2", "0"], out)
rc, out = t.run(loop + plain)
t.expect("a function without a product is left out", rc == 0 and "_Z5plainv" not in out, out)
rc, out = t.run(loop, "--filter", "nothing")
t.expect("--filter keeps to matching names", rc == 0 and "_Z4loopv" not in out, out)
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "rows.json")
    rc, out = t.run(loop, "--json", path)
    rows = json.load(open(path)) if os.path.exists(path) else []
    t.expect("--json writes the rows", rc == 0 and len(rows) == 1 and rows[0]["loop"] == ["0x10", "0x90"]
             and rows[0]["R2UR"] == 1, out)
r = t.call()
t.expect("no listing is an error", r.returncode != 0 and "give a library" in r.stderr, r.stderr)
t.finish("test_sass_loop_report")
