"""The GPU scripts' ctypes mirrors (scripts/fa_ctypes.py) of fa_attention_opts,
fa_kv_cache_opts and fa_kv_cache_info have the library's sizes: a mirror
that lags include/flashattn.h makes the engine read past the structure.
Usage: test_ctypes_mirror.py LIBFLASHATTN"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import fa_ctypes  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])
fa_ctypes.check_opts_mirror(lib)
fa_ctypes.check_kv_cache_mirrors(lib)
print(f"test_ctypes_mirror: fa_attention_opts is {fa_ctypes.opts_size(lib)} bytes, fa_kv_cache_opts "
      f"{fa_ctypes.kv_cache_opts_size(lib)}, fa_kv_cache_info {fa_ctypes.kv_cache_info_size(lib)}, as mirrored")
