"""flashattn's DLPack calls from Python through ctypes (issue 23).

Shared by tests/python/test_dlpack_numpy.py (NumPy, CPU) and
scripts/gpu_dlpack_check.py (PyTorch, GPU); docs/dlpack.md explains the
recipe.  The DLPack protocol's capsules:

  * a producer's `__dlpack__()` (or torch.utils.dlpack.to_dlpack) gives a
    PyCapsule named "dltensor" holding a DLManagedTensor *.  The consumer
    takes the pointer and, once it owns the tensor, renames the capsule
    "used_dltensor", so that the capsule's destructor leaves it alone.  An
    import that fails leaves the capsule as it was: its destructor then
    calls the deleter (the caller kept ownership).
  * to hand a tensor out, a producer wraps the DLManagedTensor * in a
    capsule named "dltensor"; whoever ends up owning it calls its deleter
    once: the consumer that renamed the capsule, or else the producer.
    A capsule destructor written in Python (a ctypes callback) is not safe:
    it may run while an exception is pending (a consumer that refused the
    tensor and drops the capsule), and ctypes then fails the callback and
    loses that exception.  So the capsule has no destructor, and the
    object that made it (Exported below) calls the deleter when it goes,
    unless the capsule was consumed.

The library is loaded with ctypes.PyDLL: its calls keep the GIL, since a
release may run a Python producer's deleter (NumPy 1.24's does
Py_DECREF without taking the GIL itself).
"""
import ctypes
import os

FA_CPU, FA_CUDA = 0, 1
FA_DTYPES = ["f32", "f16", "bf16", "f64", "bool"]
FA_STATUS = ["FA_OK", "FA_ERR_ARGUMENT", "FA_ERR_SHAPE", "FA_ERR_DTYPE", "FA_ERR_DEVICE",
             "FA_ERR_OUT_OF_MEMORY", "FA_ERR_UNSUPPORTED", "FA_ERR_BACKEND"]
FA_ERR_UNSUPPORTED = 6
FA_FILL_ARANGE = 2
kDLCPU, kDLCUDA = 1, 2

vp = ctypes.c_void_p
i64p = ctypes.POINTER(ctypes.c_int64)


# ---- the DLPack structures (dlpack.h 0.6 to 1.x: DLManagedTensor is unchanged) ----
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", vp), ("device", DLDevice), ("ndim", ctypes.c_int), ("dtype", DLDataType),
                ("shape", i64p), ("strides", i64p), ("byte_offset", ctypes.c_uint64)]


# PYFUNCTYPE: calling a deleter keeps the GIL (it may reach a Python producer's)
DELETER = ctypes.PYFUNCTYPE(None, vp)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", vp), ("deleter", DELETER)]


# ---- PyCapsule through the C API ----
_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = vp
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_New.argtypes = [vp, ctypes.c_char_p, vp]
_api.PyCapsule_New.restype = ctypes.py_object
DLTENSOR, USED_DLTENSOR = b"dltensor", b"used_dltensor"


def capsule_name(capsule):
    return _api.PyCapsule_GetName(capsule)


class Checks:
    """check = Checks(); check(cond, what) counts and prints a FAIL line;
    check.summary(name, about) prints the totals and gives the exit status."""

    def __init__(self):
        self.checks = self.failures = 0

    def __call__(self, cond, what):
        self.checks += 1
        if not cond:
            self.failures += 1
            print(f"FAIL {what}", flush=True)

    def summary(self, name, about=""):
        print(f"{name}: {about}{self.checks} checks, {self.failures} failures")
        return 1 if self.failures else 0


class FaError(RuntimeError):
    def __init__(self, what, status, message):
        super().__init__(f"{what}: {FA_STATUS[status] if 0 <= status < len(FA_STATUS) else status}: {message}")
        self.status = status
        self.message = message


def load_library(path):
    """libflashattn.so (no Lua in it) as a PyDLL."""
    return ctypes.PyDLL(path)


def default_library():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "build", "libflashattn.so")


class Engine:
    """One fa_context and the calls the DLPack tests use.  Tensors are
    fa_tensor * values (ints); release them with release()."""

    def __init__(self, path, device=FA_CPU):
        self.lib = L = load_library(path)
        sigs = {
            "fa_context_create": ([ctypes.c_int, ctypes.POINTER(vp)], ctypes.c_int),
            "fa_context_destroy": ([vp], None),
            "fa_context_error": ([vp], ctypes.c_char_p),
            "fa_context_set_stream": ([vp, vp], ctypes.c_int),
            "fa_sync": ([vp], ctypes.c_int),
            "fa_tensor_from_dlpack": ([vp, vp, ctypes.POINTER(vp)], ctypes.c_int),
            "fa_tensor_to_dlpack": ([vp, vp, ctypes.POINTER(vp)], ctypes.c_int),
            "fa_tensor_empty": ([vp, ctypes.c_int, i64p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(vp)], ctypes.c_int),
            "fa_tensor_release": ([vp], None),
            "fa_tensor_data": ([vp], vp),
            "fa_tensor_dtype": ([vp], ctypes.c_int),
            "fa_tensor_device": ([vp], ctypes.c_int),
            "fa_tensor_ndim": ([vp], ctypes.c_int),
            "fa_tensor_size": ([vp, ctypes.c_int], ctypes.c_int64),
            "fa_tensor_stride": ([vp, ctypes.c_int], ctypes.c_int64),
            "fa_tensor_numel": ([vp], ctypes.c_int64),
            "fa_tensor_fill_random": ([vp, vp, ctypes.c_int, ctypes.c_uint64], ctypes.c_int),
            "fa_tensor_fill": ([vp, vp, ctypes.c_double], ctypes.c_int),
            "fa_tensor_read_f64": ([vp, vp, ctypes.POINTER(ctypes.c_double)], ctypes.c_int),
            "fa_tensor_transpose": ([vp, vp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(vp)], ctypes.c_int),
            "fa_tensor_narrow": ([vp, vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(vp)],
                                 ctypes.c_int),
            "fa_softmax": ([vp, vp, vp, ctypes.POINTER(vp)], ctypes.c_int),
            "fa_attention": ([vp, vp, vp, vp, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)], ctypes.c_int),
            "fa_memory": ([ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None),
        }
        for name, (args, res) in sigs.items():
            f = getattr(L, name)
            f.argtypes, f.restype = args, res
        self.ctx = vp()
        self.check(L.fa_context_create(device, ctypes.byref(self.ctx)), "fa_context_create")

    def close(self):
        if self.ctx:
            self.lib.fa_context_destroy(self.ctx)
            self.ctx = vp()

    def error(self):
        msg = self.lib.fa_context_error(self.ctx)
        return msg.decode() if msg else ""

    def check(self, status, what):
        if status:
            raise FaError(what, status, self.error() if self.ctx else "")

    def memory(self, device=FA_CPU):
        cur, peak = ctypes.c_size_t(), ctypes.c_size_t()
        self.lib.fa_memory(device, ctypes.byref(cur), ctypes.byref(peak))
        return cur.value

    # ---- DLPack ----
    def from_capsule(self, capsule):
        """An fa_tensor over a "dltensor" capsule's tensor, zero copy.  On
        success the engine owns the DLManagedTensor and the capsule is
        renamed "used_dltensor"; on failure (FaError) it is untouched."""
        managed = _api.PyCapsule_GetPointer(capsule, DLTENSOR)
        out = vp()
        self.check(self.lib.fa_tensor_from_dlpack(self.ctx, managed, ctypes.byref(out)), "fa_tensor_from_dlpack")
        _api.PyCapsule_SetName(capsule, USED_DLTENSOR)
        return out.value

    def from_dlpack(self, obj, **kw):
        """From any object with __dlpack__ (a NumPy array, a torch tensor)."""
        return self.from_capsule(obj.__dlpack__(**kw))

    def export(self, t, device=(kDLCPU, 0)):
        """An Exported over fa_tensor t, for np.from_dlpack / torch.from_dlpack
        (or its .capsule for torch.utils.dlpack.from_dlpack)."""
        return Exported(self, t, device)

    # ---- tensors ----
    def empty(self, shape, dtype="f32", device=FA_CPU):
        out = vp()
        arr = (ctypes.c_int64 * len(shape))(*shape)
        self.check(self.lib.fa_tensor_empty(self.ctx, len(shape), arr, FA_DTYPES.index(dtype), device,
                                            ctypes.byref(out)), "fa_tensor_empty")
        return out.value

    def arange(self, shape, dtype="f32", device=FA_CPU):
        t = self.empty(shape, dtype, device)
        self.check(self.lib.fa_tensor_fill_random(self.ctx, t, FA_FILL_ARANGE, 0), "fill arange")
        return t

    def view(self, fn, t, *args):
        out = vp()
        self.check(getattr(self.lib, fn)(self.ctx, t, *args, ctypes.byref(out)), fn)
        return out.value

    def release(self, t):
        self.lib.fa_tensor_release(t)

    def shape(self, t):
        return tuple(self.lib.fa_tensor_size(t, i) for i in range(self.lib.fa_tensor_ndim(t)))

    def strides(self, t):
        return tuple(self.lib.fa_tensor_stride(t, i) for i in range(self.lib.fa_tensor_ndim(t)))

    def dtype(self, t):
        return FA_DTYPES[self.lib.fa_tensor_dtype(t)]

    def data(self, t):
        return self.lib.fa_tensor_data(t) or 0

    def values(self, t):
        """Row-major list of the elements as floats (any device)."""
        n = self.lib.fa_tensor_numel(t)
        buf = (ctypes.c_double * max(n, 1))()
        self.check(self.lib.fa_tensor_read_f64(self.ctx, t, buf), "fa_tensor_read_f64")
        return list(buf[:n])


class Exported:
    """A tensor handed out: what np.from_dlpack and torch.from_dlpack take
    (__dlpack__ and __dlpack_device__), holding the capsule over the
    engine's DLManagedTensor.  The tensor holds a reference to the
    fa_tensor, so the caller may release its own at once.  When this object
    goes (or close() is called) and no consumer took the capsule, it calls
    the deleter itself."""

    def __init__(self, engine, t, device=(kDLCPU, 0)):
        managed = vp()
        engine.check(engine.lib.fa_tensor_to_dlpack(engine.ctx, t, ctypes.byref(managed)), "fa_tensor_to_dlpack")
        self.managed = ctypes.cast(managed, ctypes.POINTER(DLManagedTensor))
        self.capsule = _api.PyCapsule_New(managed.value, DLTENSOR, None)
        self.device = device

    def __dlpack__(self, stream=None):
        return self.capsule

    def __dlpack_device__(self):
        return self.device

    def consumed(self):
        return capsule_name(self.capsule) == USED_DLTENSOR

    def close(self):
        if self.capsule is not None and not self.consumed():
            _api.PyCapsule_SetName(self.capsule, USED_DLTENSOR)
            self.managed.contents.deleter(ctypes.cast(self.managed, vp))
        self.capsule = None

    def __del__(self):
        self.close()
