#!/usr/bin/env python3
"""Function-by-function comparison of cubins, with no cuobjdump (this machine's CUDA toolkit has nvcc and
ptxas alone): for each kernel of A, which of B, C, ... hold the same bytes in its ELF sections .text.NAME
(the SASS) and .nv.info.NAME (registers, barriers, attributes).  A kernel change that leaves a function's
SASS unchanged keeps the outside oracle's verdict on a build of the earlier code.

  nvcc -O3 -DNDEBUG -DFA_HAVE_CUDA -DFA_HAVE_DLPACK -DFA_HAVE_OPENBLAS_THREADS -std=c++17 \
    --options-file BUILD/CMakeFiles/flashattn_objects.dir/includes_CUDA.rsp -arch=sm_90a -cubin FILE.cu -o A.cubin
  (the same from a git worktree of the base, into B.cubin)
  python3 scripts/cubin_cmp.py A.cubin B.cubin [C.cubin ...]
"""
import struct
import sys


def sections(path):
    """The ELF64 file's sections by name: their bytes."""
    b = open(path, "rb").read()
    if b[:4] != b"\x7fELF" or b[4] != 2:
        sys.exit(f"cubin_cmp: {path} is not an ELF64 file")
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdr = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdr[shstrndx][4]

    def name(off):
        return b[strtab + off:b.index(b"\0", strtab + off)].decode()
    return {name(h[0]): b[h[4]:h[4] + h[5]] for h in hdr}


def functions(path):
    s = sections(path)
    return {n[len(".text."):]: (s[n], s.get(".nv.info." + n[len(".text."):]))
            for n in s if n.startswith(".text.")}


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: cubin_cmp.py A.cubin B.cubin [C.cubin ...]")
    a, others = functions(sys.argv[1]), [functions(p) for p in sys.argv[2:]]
    counts = {}
    for n in sorted(a):
        same = [sys.argv[2 + i] for i, o in enumerate(others) if o.get(n) == a[n]]
        verdict = "same as " + ", ".join(same) if same else "DIFFERENT"
        counts[verdict] = counts.get(verdict, 0) + 1
        print(verdict, n)
    for verdict, c in sorted(counts.items()):
        print(f"cubin_cmp: {c} of {len(a)} functions {verdict}")


if __name__ == "__main__":
    main()
