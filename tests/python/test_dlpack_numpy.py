"""DLPack between flashattn and NumPy on the CPU, through ctypes (issue 23).

    python3 tests/python/test_dlpack_numpy.py [path/to/libflashattn.so]

Exits 77 (CTest: skipped) when NumPy is missing, is too old for DLPack
(np.from_dlpack and ndarray.__dlpack__ came in 1.22) or the library was
built without dlpack.h.  Checks: zero copy both ways (data pointers equal,
writes seen on the other side), every dtype NumPy has (float32, float16,
float64; bool as uint8, bfloat16 refused by NumPy with the capsule's
deleter still run), views (slices, transposes, column-major), strides,
kernels on imported arrays against NumPy's own arithmetic, refused imports
that leave the capsule to its owner, reference counts of the arrays (each
deleter once) and the engine's memory back to where it started.
"""
import gc
import os
import sys

SKIP = 77
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

try:
    import numpy as np
except ImportError:
    print("test_dlpack_numpy: numpy is not installed: skipped")
    sys.exit(SKIP)
if not hasattr(np, "from_dlpack") or not hasattr(np.ndarray, "__dlpack__"):
    print(f"test_dlpack_numpy: numpy {np.__version__} has no DLPack: skipped")
    sys.exit(SKIP)

import flashattn_dlpack as fd  # noqa: E402

check = fd.Checks()


def addr(a):
    return a.__array_interface__["data"][0]


def refused(fn, *args):
    """The message of the FaError a call raises (None when it succeeds);
    not the exception itself: its traceback would keep the call's
    arguments alive."""
    try:
        fn(*args)
    except fd.FaError as e:
        return e.message
    return None


lib_path = sys.argv[1] if len(sys.argv) > 1 else fd.default_library()
eng = fd.Engine(lib_path)
probe = eng.arange([2])
try:
    eng.export(probe).close()
except fd.FaError as e:
    if e.status == fd.FA_ERR_UNSUPPORTED:
        print("test_dlpack_numpy: the library was built without DLPack: skipped")
        sys.exit(SKIP)
    raise
finally:
    eng.release(probe)
gc.collect()
mem0 = eng.memory()


# ---- NumPy -> engine ------------------------------------------------------
def import_case(name, a, want_dtype):
    """Import a, check zero copy, values and the reference the capsule's
    tensor holds on a; the engine's release drops it (the deleter, once)."""
    rc = sys.getrefcount(a)
    t = eng.from_dlpack(a)
    check(sys.getrefcount(a) == rc + 1, f"{name}: the DLManagedTensor holds a reference to the array")
    check(eng.dtype(t) == want_dtype, f"{name}: dtype {eng.dtype(t)}, expected {want_dtype}")
    check(eng.shape(t) == a.shape, f"{name}: shape {eng.shape(t)} vs {a.shape}")
    want_strides = tuple(s // a.itemsize for s in a.strides)
    got = eng.strides(t)
    if a.size:  # (an empty one's are row-major whatever it gave)
        check(all(g == w for g, w, n in zip(got, want_strides, a.shape) if n > 1),
              f"{name}: strides {got} vs {want_strides}")
        check(eng.data(t) == addr(a), f"{name}: zero copy: {eng.data(t):#x} vs {addr(a):#x}")
    want = [float(bool(x)) if want_dtype == "bool" else float(x) for x in a.ravel()]
    check(eng.values(t) == want, f"{name}: values")
    eng.release(t)
    check(sys.getrefcount(a) == rc, f"{name}: the deleter ran once (refcount {sys.getrefcount(a)} vs {rc})")


base = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
import_case("float32", base, "f32")
import_case("float16", base.astype(np.float16), "f16")
import_case("float64", base.astype(np.float64), "f64")
import_case("slice [:, 1:, ::2]", base[:, 1:, ::2], "f32")
import_case("transpose", base.transpose(2, 0, 1), "f32")
import_case("column-major", np.asfortranarray(base[0]), "f32")
import_case("select [1]", base[1], "f32")
import_case("1-D", np.linspace(-1, 1, 7), "f64")
import_case("4-D", np.ones((2, 1, 3, 2), dtype=np.float32), "f32")
import_case("empty", np.zeros((0, 3), dtype=np.float32), "f32")
import_case("uint8 as bool", np.array([0, 1, 2, 0], dtype=np.uint8), "bool")
try:
    bcap = np.array([True, False, True]).__dlpack__()
except (BufferError, TypeError):
    bcap = None  # NumPy 1.24 hands out no bool
if bcap is not None:
    t = eng.from_capsule(bcap)
    check(eng.dtype(t) == "bool" and eng.values(t) == [1.0, 0.0, 1.0], "numpy bool")
    eng.release(t)
    del bcap

# writes from either side are seen by the other
a = np.zeros((3, 4), dtype=np.float32)
t = eng.from_dlpack(a)
eng.check(eng.lib.fa_tensor_fill(eng.ctx, t, 1.5), "fill")
check(bool((a == 1.5).all()), "engine's fill lands in the NumPy array")
a[2, 3] = -4
check(eng.values(t)[-1] == -4.0, "NumPy's write seen by the engine")
# the tensor outlives the array's Python name
del a
gc.collect()
check(eng.values(t)[0] == 1.5, "the array stays alive while the engine holds it")
eng.release(t)

# kernels on imported arrays: softmax over rows of a transposed view, and
# attention on (B, L, H, D) arrays viewed as (B, H, L, D), against NumPy
rng = np.random.default_rng(1)
x = rng.standard_normal((5, 7)).astype(np.float32).T  # 7 x 5, column-major
tx = eng.from_dlpack(x)
y = fd.vp()
eng.check(eng.lib.fa_softmax(eng.ctx, tx, None, fd.ctypes.byref(y)), "fa_softmax")
ny = np.from_dlpack(eng.export(y.value))
e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
ref = e / e.sum(axis=1, keepdims=True)
check(np.abs(ny - ref).max() < 1e-6, f"softmax of an imported view: max error {np.abs(ny - ref).max()}")
eng.release(y.value)
eng.release(tx)
del ny

B, L, H, D = 2, 9, 3, 8
q, k, v = (rng.standard_normal((B, L, H, D)) for _ in range(3))  # f64
tq, tk, tv = (eng.from_dlpack(a.transpose(0, 2, 1, 3)) for a in (q, k, v))
o = fd.vp()
eng.check(eng.lib.fa_attention(eng.ctx, tq, tk, tv, None, fd.ctypes.byref(o), None), "fa_attention")
no = np.from_dlpack(eng.export(o.value))
qh, kh, vh = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(D)
p = np.exp(s - s.max(axis=-1, keepdims=True))
ref = (p / p.sum(axis=-1, keepdims=True)) @ vh
check(no.shape == (B, H, L, D) and np.abs(no - ref).max() < 1e-10,
      f"attention on (B, L, H, D) arrays viewed as (B, H, L, D): max error {np.abs(no - ref).max()}")
for t in (tq, tk, tv, o.value):
    eng.release(t)
del no

# refused imports: a clear error, the capsule untouched (still "dltensor")
# and its own destructor frees the tensor (the array's count comes back)
a = np.arange(12, dtype=np.float32).reshape(3, 4)
for name, arr, word in [("negative strides", a[::-1], "negative"),
                        ("int64", np.arange(4), "int64"),
                        ("int32", np.arange(4, dtype=np.int32), "int32"),
                        ("complex", np.zeros(3, dtype=np.complex64), "complex"),
                        ("scalar (rank 0)", np.array(3.0, dtype=np.float32), "scalar"),
                        ("rank 5", np.zeros((1, 1, 1, 1, 2), dtype=np.float32), "got 5")]:
    try:
        cap = arr.__dlpack__()
    except (BufferError, TypeError):
        continue  # NumPy does not hand this one out at all
    rc = sys.getrefcount(arr)
    msg = refused(eng.from_capsule, cap)
    check(msg is not None, f"{name}: refused")
    if msg:
        check("fa_tensor_from_dlpack" in msg and word in msg, f"{name}: message {msg!r}")
    check(fd.capsule_name(cap) == fd.DLTENSOR, f"{name}: the capsule is left to its owner")
    del cap
    check(sys.getrefcount(arr) == rc - 1, f"{name}: the capsule's destructor ran the deleter")

# ---- engine -> NumPy --------------------------------------------------------
def export_case(name, t, want_dtype, want_values):
    before = eng.memory()
    arr = np.from_dlpack(eng.export(t))
    check(arr.dtype == want_dtype, f"{name}: dtype {arr.dtype}, expected {want_dtype}")
    check(arr.shape == eng.shape(t), f"{name}: shape {arr.shape} vs {eng.shape(t)}")
    check(arr.strides == tuple(s * arr.itemsize for s in eng.strides(t)), f"{name}: strides {arr.strides}")
    check(addr(arr) == eng.data(t), f"{name}: zero copy: {addr(arr):#x} vs {eng.data(t):#x}")
    check(arr.ravel().tolist() == want_values, f"{name}: values")
    check(eng.memory() > before, f"{name}: the export holds a record")
    eng.release(t)  # the array keeps the storage alive
    check(arr.ravel().tolist() == want_values, f"{name}: values after the engine's release")
    del arr
    gc.collect()
    check(eng.memory() < before, f"{name}: the array's deleter freed the export")


base_vals = [float(i) for i in range(24)]
for dt, npdt in [("f32", np.float32), ("f16", np.float16), ("f64", np.float64)]:
    export_case(dt, eng.arange([2, 3, 4], dt), npdt, base_vals)
export_case("bool (uint8 under DLPack 0.6)", eng.arange([4], "bool"),
            np.dtype(np.uint8), [0, 1, 1, 1])
t = eng.arange([2, 3, 4])
tt = eng.view("fa_tensor_transpose", t, 0, 2)
export_case("transposed view", tt, np.float32, np.arange(24.0).reshape(2, 3, 4).transpose(2, 1, 0).ravel().tolist())
tn = eng.view("fa_tensor_narrow", t, 2, 1, 2)
export_case("narrowed view (offset)", tn, np.float32, np.arange(24.0).reshape(2, 3, 4)[:, :, 1:3].ravel().tolist())
eng.release(t)

# the engine's writes are the array's (NumPy makes arrays from DLPack read-only)
t = eng.arange([6])
arr = np.from_dlpack(eng.export(t))
eng.check(eng.lib.fa_tensor_fill(eng.ctx, t, 42.0), "fill")
check(arr.tolist() == [42.0] * 6, "the engine's write to an exported tensor seen by NumPy")
del arr
eng.release(t)

# bf16: NumPy refuses it; the capsule, never consumed, frees the export
before = eng.memory()
t = eng.arange([3], "bf16")
try:
    np.from_dlpack(eng.export(t))
    check(False, "bf16: NumPy took it")
except (BufferError, TypeError, ValueError, RuntimeError):
    pass
gc.collect()
eng.release(t)
check(eng.memory() == before, f"bf16: memory {eng.memory()} vs {before} (the refused capsule's destructor)")

# an export nobody consumes frees its tensor when it goes
before = eng.memory()
t = eng.arange([4])
ex = eng.export(t)
eng.release(t)
check(eng.memory() > before, "the export holds the tensor")
del ex
check(eng.memory() == before, "an unconsumed export's deleter ran when it went")

# round trip NumPy -> engine -> NumPy
a = np.arange(6, dtype=np.float64).reshape(2, 3)
rc = sys.getrefcount(a)
t = eng.from_dlpack(a)
b = np.from_dlpack(eng.export(t))
eng.release(t)
check(addr(b) == addr(a) and b.tolist() == a.tolist(), "NumPy -> engine -> NumPy: the same memory")
check(sys.getrefcount(a) == rc + 1, "the round trip holds one reference to the array")
del b
gc.collect()
check(sys.getrefcount(a) == rc, "and drops it when the last holder goes")

gc.collect()
check(eng.memory() == mem0, f"engine memory {eng.memory()} at the end, {mem0} at the start")
eng.close()
sys.exit(check.summary("test_dlpack_numpy", f"numpy {np.__version__}: "))
