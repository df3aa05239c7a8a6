"""ctypes mirrors of the C API's structures (include/flashattn.h), shared by
the GPU scripts (oracle_attention.py, bench_layouts.py) and checked in CI
(tests/python/test_ctypes_mirror.py): a mirror that lags the header makes
the engine read past the structure, as the oracle's did (2026-11-25).
Mirrored: fa_attention_opts (AttnOpts), fa_kv_cache_opts (KvCacheOpts),
fa_kv_cache_info (KvCacheInfo)."""
import ctypes

FA_CPU, FA_CUDA = 0, 1
FA_DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "f64": 3, "bool": 4}
ALGOS = {"auto": 0, "naive": 1, "two_pass": 2, "flash_row": 3, "flash": 4}
CAUSAL = {"none": 0, "bottom_right": 1, "top_left": 2}
FA_STATUS = {0: "FA_OK", 1: "FA_ERR_ARGUMENT", 2: "FA_ERR_SHAPE", 3: "FA_ERR_DTYPE", 4: "FA_ERR_DEVICE",
             5: "FA_ERR_OUT_OF_MEMORY", 6: "FA_ERR_UNSUPPORTED", 7: "FA_ERR_BACKEND"}


class AttnOpts(ctypes.Structure):
    """fa_attention_opts, field for field."""
    _fields_ = [("algo", ctypes.c_int), ("has_scale", ctypes.c_int), ("scale", ctypes.c_double),
                ("causal", ctypes.c_int), ("has_window", ctypes.c_int), ("window_left", ctypes.c_int64),
                ("window_right", ctypes.c_int64), ("mask", ctypes.c_void_p), ("kv_lens", ctypes.POINTER(ctypes.c_int64)),
                ("n_kv_lens", ctypes.c_int64), ("alibi", ctypes.POINTER(ctypes.c_double)), ("n_alibi", ctypes.c_int64),
                ("softcap", ctypes.c_double), ("tile_q", ctypes.c_int64), ("tile_k", ctypes.c_int64),
                ("return_lse", ctypes.c_int), ("out", ctypes.c_void_p), ("lse_out", ctypes.c_void_p),
                ("splits", ctypes.c_int64), ("kernel", ctypes.c_char_p),
                ("score_mod", ctypes.c_void_p), ("mask_mod", ctypes.c_void_p), ("block_mask", ctypes.c_void_p),
                ("deterministic", ctypes.c_int)]


class KvCacheOpts(ctypes.Structure):
    """fa_kv_cache_opts, field for field (the enums dtype and device are ints)."""
    _fields_ = [("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("dim", ctypes.c_int64),
                ("dim_v", ctypes.c_int64), ("capacity", ctypes.c_int64), ("page_size", ctypes.c_int64),
                ("pages", ctypes.c_int64), ("dtype", ctypes.c_int), ("device", ctypes.c_int)]


class KvCacheInfo(ctypes.Structure):
    """fa_kv_cache_info, field for field."""
    _fields_ = [("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("dim", ctypes.c_int64),
                ("dim_v", ctypes.c_int64), ("capacity", ctypes.c_int64), ("page_size", ctypes.c_int64),
                ("pages", ctypes.c_int64), ("free_pages", ctypes.c_int64), ("dtype", ctypes.c_int),
                ("device", ctypes.c_int)]


def written_size(write):
    """The extent of what write(buf) stores into a buffer of marks: the
    size of a structure whose last bytes it writes (an init function that
    clears the whole structure, padding included)."""
    mark, n = 0xA5, 4096
    buf = (ctypes.c_ubyte * n)(*([mark] * n))
    write(buf)
    return max(i for i in range(n) if buf[i] != mark) + 1


def opts_size(lib):
    """sizeof(fa_attention_opts) as the library sees it: the bytes that
    fa_attention_opts_init writes (it clears the whole structure, padding
    included)."""
    lib.fa_attention_opts_init.argtypes = [ctypes.c_void_p]
    lib.fa_attention_opts_init.restype = None
    return written_size(lib.fa_attention_opts_init)


def kv_cache_opts_size(lib):
    """sizeof(fa_kv_cache_opts) as the library sees it: fa_kv_cache_opts_init
    clears the whole structure (its last field, device, is set to -1)."""
    lib.fa_kv_cache_opts_init.argtypes = [ctypes.c_void_p]
    lib.fa_kv_cache_opts_init.restype = None
    return written_size(lib.fa_kv_cache_opts_init)


def kv_cache_info_size(lib):
    """The extent of fa_kv_cache_info as the library sees it: there is no
    init function, but fa_kv_cache_get_info with a NULL cache (and context)
    sets every field to -1 before it fails.  Its fields leave no trailing
    padding, so the extent is its size."""
    lib.fa_kv_cache_get_info.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.fa_kv_cache_get_info.restype = ctypes.c_int
    return written_size(lambda buf: lib.fa_kv_cache_get_info(None, None, buf))


def check_mirror(mirror, c_name, size):
    """Raises when the ctypes mirror and the library's structure (size bytes) differ in size."""
    mine = ctypes.sizeof(mirror)
    if size != mine:
        raise RuntimeError(f"scripts/fa_ctypes.py: {mirror.__name__} is {mine} bytes, the library's {c_name} "
                           f"{size}: update the mirror from include/flashattn.h")


def check_opts_mirror(lib):
    """Raises when AttnOpts and the library's fa_attention_opts differ in size."""
    check_mirror(AttnOpts, "fa_attention_opts", opts_size(lib))


def check_kv_cache_mirrors(lib):
    """Raises when KvCacheOpts or KvCacheInfo and the library's structures differ in size."""
    check_mirror(KvCacheOpts, "fa_kv_cache_opts", kv_cache_opts_size(lib))
    check_mirror(KvCacheInfo, "fa_kv_cache_info", kv_cache_info_size(lib))
