"""The GPU scripts' ctypes mirror of fa_attention_opts (scripts/fa_ctypes.py)
has the library's size: a mirror that lags include/flashattn.h makes the
engine read past the structure.  Usage: test_ctypes_mirror.py LIBFLASHATTN"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import fa_ctypes  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])
fa_ctypes.check_opts_mirror(lib)
print(f"test_ctypes_mirror: fa_attention_opts is {fa_ctypes.opts_size(lib)} bytes, as mirrored")
