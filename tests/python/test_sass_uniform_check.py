"""scripts/sass_uniform_check.py on synthetic cuobjdump -sass listings: a function whose copy reads
its shared address and cache policy from uniform registers nothing writes is flagged (exit 1), the
same function with them written passes, ULDC.64 / R2UR / UMOV define what they name, HGMMA with A in
registers reads only B's descriptor, --filter keeps to matching names, and no listing is an error."""
from sass_listing import ScriptTest, listing

t = ScriptTest("sass_uniform_check.py")


unset = listing("_Z6brokenv", ["ULDC.64 UR12, c[0x0][0x208]", "MOV R209, RZ",
                               "LDGSTS.E.BYPASS.128 [R209+UR0], desc[UR1][R206.64], !P0",
                               "LDG.E R2, desc[UR12][R4.64]", "EXIT"])
fine = listing("_Z4finev", ["ULDC.64 UR12, c[0x0][0x208]", "UMOV UR0, 0x400", "UMOV UR8, 0xf0",
                            "USHF.R.U32 UR8, UR8, 0x4, URZ", "UMOV UR9, 0x120", "UMOV UR8, URZ",
                            "LDGSTS.E.BYPASS.128 [R41+UR0], desc[UR8][R32.64], !P1",
                            "@!P0 LDG.E.64 R14, desc[UR12][R4.64]", "R2UR UR23, R201", "R2UR UR22, R200",
                            "HGMMA.64x64x16.F32 R24, R104, gdesc[UR20], RZ, !UPT", "EXIT"])
ssmode = listing("_Z6ssmodev", ["R2UR UR22, R200", "R2UR UR23, R201",
                                "HGMMA.64x64x16.F32 R24, gdesc[UR20], RZ, !UPT", "EXIT"])

rc, out = t.run(unset)
t.expect("an unset policy and address are flagged", rc == 1 and "UNSET _Z6brokenv" in out and "UR0, UR1, UR2" in out, out)
rc, out = t.run(fine)
t.expect("registers written somewhere in the function pass", rc == 0 and "1 functions, 0 reading" in out, out)
rc, out = t.run(ssmode)
t.expect("HGMMA with A's descriptor too reads n .. n + 3", rc == 1 and "UR20, UR21" in out, out)
rc, out = t.run(fine + unset)
t.expect("two functions, one flagged", rc == 1 and "2 functions, 1 reading" in out and "_Z4finev" not in out, out)
rc, out = t.run(fine + unset, "--filter", "fine")
t.expect("--filter keeps to matching names", rc == 0 and "1 functions, 0 reading" in out, out)
r = t.call()
t.expect("no listing is an error", r.returncode == 2 and "give a library" in r.stderr, r.stderr)
t.finish("test_sass_uniform_check")
