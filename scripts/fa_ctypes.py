"""ctypes mirrors of the C API's structures (include/flashattn.h), shared by
the GPU scripts (oracle_attention.py, bench_layouts.py) and checked in CI
(tests/python/test_ctypes_mirror.py): a mirror that lags the header makes
the engine read past the structure, as the oracle's did (2026-11-25)."""
import ctypes

FA_CPU, FA_CUDA = 0, 1
FA_DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "f64": 3, "bool": 4}
ALGOS = {"auto": 0, "naive": 1, "two_pass": 2, "flash_row": 3, "flash": 4}
CAUSAL = {"none": 0, "bottom_right": 1, "top_left": 2}


class AttnOpts(ctypes.Structure):
    """fa_attention_opts, field for field."""
    _fields_ = [("algo", ctypes.c_int), ("has_scale", ctypes.c_int), ("scale", ctypes.c_double),
                ("causal", ctypes.c_int), ("has_window", ctypes.c_int), ("window_left", ctypes.c_int64),
                ("window_right", ctypes.c_int64), ("mask", ctypes.c_void_p), ("kv_lens", ctypes.POINTER(ctypes.c_int64)),
                ("n_kv_lens", ctypes.c_int64), ("alibi", ctypes.POINTER(ctypes.c_double)), ("n_alibi", ctypes.c_int64),
                ("softcap", ctypes.c_double), ("tile_q", ctypes.c_int64), ("tile_k", ctypes.c_int64),
                ("return_lse", ctypes.c_int), ("out", ctypes.c_void_p), ("lse_out", ctypes.c_void_p),
                ("splits", ctypes.c_int64), ("kernel", ctypes.c_char_p),
                ("score_mod", ctypes.c_void_p), ("mask_mod", ctypes.c_void_p), ("block_mask", ctypes.c_void_p)]


def opts_size(lib):
    """sizeof(fa_attention_opts) as the library sees it: the bytes that
    fa_attention_opts_init writes (it clears the whole structure, padding
    included) into a buffer of marks."""
    mark, n = 0xA5, 4096
    buf = (ctypes.c_ubyte * n)(*([mark] * n))
    lib.fa_attention_opts_init.argtypes = [ctypes.c_void_p]
    lib.fa_attention_opts_init.restype = None
    lib.fa_attention_opts_init(buf)
    return max(i for i in range(n) if buf[i] != mark) + 1


def check_opts_mirror(lib):
    """Raises when AttnOpts and the library's fa_attention_opts differ in size."""
    size, mine = opts_size(lib), ctypes.sizeof(AttnOpts)
    if size != mine:
        raise RuntimeError(f"scripts/fa_ctypes.py: AttnOpts is {mine} bytes, the library's fa_attention_opts "
                           f"{size}: update the mirror from include/flashattn.h")
