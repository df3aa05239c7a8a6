#!/usr/bin/env python3
"""DLPack between flashattn and PyTorch on the GPU, through ctypes (issue 23).

    python3 scripts/gpu_dlpack_check.py --lib build-gpu/libflashattn.so

Run by scripts/gpu_run.sh's `test` stage.  Uses the same ctypes recipe as
tests/python/test_dlpack_numpy.py (tests/python/flashattn_dlpack.py) on a
CUDA context that runs on torch's current stream, and checks:

  * torch -> engine (torch.utils.dlpack.to_dlpack): every dtype (f32, f16,
    bf16, f64, bool), contiguous tensors and views (transpose, slices with
    an offset), zero copy (the engine's data pointer is torch's
    data_ptr()), values, writes seen both ways, and torch's deleter run when
    the engine's last reference goes (torch.cuda.memory_allocated() drops);
  * attention on torch's (B, L, H, D) tensors viewed as (B, H, L, D),
    against torch's own softmax(QK^T)V in f64, its output handed back to
    torch without a copy;
  * engine -> torch (torch.from_dlpack and torch.utils.dlpack.from_dlpack):
    every dtype (bool arrives as uint8 under a DLPack 0.6 header), views,
    zero copy, device kDLCUDA with the current device's id, the engine's
    memory back when torch lets go;
  * refused imports (int64, negative strides: torch's flip is a copy, so a
    hand-made one) leave the capsule to torch, which frees it;
  * the same on the CPU (kDLCPU) for one case each way.

Ends with "gpu_dlpack_check: N checks, M failures"; exit status 1 on a
failure, 2 when torch or CUDA is missing, 3 when the library has no DLPack.
"""
import argparse
import gc
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import flashattn_dlpack as fd  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--lib", default="build-gpu/libflashattn.so", help="the engine's shared library")
args = ap.parse_args()

try:
    import torch
    import torch.utils.dlpack as tdl
except ImportError as e:
    print(f"gpu_dlpack_check: torch is not installed ({e})", file=sys.stderr)
    sys.exit(2)
if not torch.cuda.is_available():
    print("gpu_dlpack_check: no CUDA device for torch", file=sys.stderr)
    sys.exit(2)

check = fd.Checks()


dev = torch.device("cuda", torch.cuda.current_device())
eng = fd.Engine(args.lib, fd.FA_CUDA)
probe = eng.arange([1])
try:
    eng.export(probe).close()
except fd.FaError as e:
    if e.status == fd.FA_ERR_UNSUPPORTED:
        print("gpu_dlpack_check: FAIL: the library was built without DLPack (dlpack/dlpack.h not found: the GPU "
              "machine needs libdlpack-dev, e.g. in .deps through scripts/fetch_gpu_deps.sh)", file=sys.stderr)
        sys.exit(3)
    raise
finally:
    eng.release(probe)
eng.check(eng.lib.fa_context_set_stream(eng.ctx, torch.cuda.current_stream().cuda_stream), "fa_context_set_stream")
gc.collect()
torch.cuda.synchronize()
mem0 = eng.memory(fd.FA_CUDA), eng.memory(fd.FA_CPU)
CUDA_DEVICE = (fd.kDLCUDA, dev.index)
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
                "bool": torch.bool}


def sync():
    eng.check(eng.lib.fa_sync(eng.ctx), "fa_sync")
    torch.cuda.synchronize()


def torch_values(x):
    return [float(v) for v in x.detach().to("cpu", torch.float64).flatten().tolist()]


# ---- torch -> engine ---------------------------------------------------------
def import_case(name, x, want_dtype, device=fd.FA_CUDA):
    t = eng.from_capsule(tdl.to_dlpack(x))
    check(eng.dtype(t) == want_dtype, f"{name}: dtype {eng.dtype(t)}, expected {want_dtype}")
    check(eng.lib.fa_tensor_device(t) == device, f"{name}: device")
    check(eng.shape(t) == tuple(x.shape), f"{name}: shape {eng.shape(t)} vs {tuple(x.shape)}")
    check(all(a == b for a, b, n in zip(eng.strides(t), x.stride(), x.shape) if n > 1),
          f"{name}: strides {eng.strides(t)} vs {x.stride()}")
    check(eng.data(t) == x.data_ptr(), f"{name}: zero copy: {eng.data(t):#x} vs {x.data_ptr():#x}")
    sync()
    check(eng.values(t) == torch_values(x), f"{name}: values")
    eng.release(t)


base = torch.arange(2 * 3 * 8, device=dev, dtype=torch.float32).reshape(2, 3, 8)
for dt, tdt in TORCH_DTYPES.items():
    import_case(dt, (base % 2 if dt == "bool" else base).to(tdt), dt)
import_case("transpose", base.transpose(0, 2), "f32")
import_case("slice with an offset", base[1:, :, 2:6], "f32")
import_case("column of a matrix", base[0, :, 3], "f32")
import_case("cpu", base.cpu().to(torch.float16), "f16", fd.FA_CPU)

# writes both ways, through one storage
x = torch.zeros(4, 8, device=dev)
t = eng.from_capsule(tdl.to_dlpack(x))
eng.check(eng.lib.fa_tensor_fill(eng.ctx, t, 2.5), "fill")
sync()
check(bool((x == 2.5).all()), "the engine's fill lands in torch's tensor")
x[3, 7] = -1
torch.cuda.synchronize()
check(eng.values(t)[-1] == -1.0, "torch's write seen by the engine")
eng.release(t)

# torch's deleter runs when the engine's last reference goes: 64 MiB that
# torch frees only then (the engine holds a view of it too)
big = torch.empty(16 << 20, device=dev)
torch.cuda.synchronize()
allocated = torch.cuda.memory_allocated()
t = eng.from_capsule(tdl.to_dlpack(big))
v = eng.view("fa_tensor_narrow", t, 0, 5, 10)
del big
gc.collect()
check(torch.cuda.memory_allocated() == allocated, "torch's memory stays while the engine holds it")
eng.release(t)
check(torch.cuda.memory_allocated() == allocated, "a view of it still holds it")
eng.release(v)
torch.cuda.synchronize()
check(torch.cuda.memory_allocated() == allocated - (64 << 20),
      f"torch's deleter freed it: {torch.cuda.memory_allocated()} vs {allocated - (64 << 20)}")

# attention on torch's (B, L, H, D) tensors viewed as (B, H, L, D); the output to torch without a copy
B, L, H, D = 2, 130, 4, 64
g = torch.Generator(device=dev).manual_seed(1)
for dt in ("f16", "bf16", "f32"):
    q, k, v_ = (torch.randn(B, L, H, D, device=dev, generator=g).to(TORCH_DTYPES[dt]) for _ in range(3))
    tq, tk, tv = (eng.from_capsule(tdl.to_dlpack(a.transpose(1, 2))) for a in (q, k, v_))
    o = fd.vp()
    eng.check(eng.lib.fa_attention(eng.ctx, tq, tk, tv, None, fd.ctypes.byref(o), None), f"fa_attention {dt}")
    out = torch.from_dlpack(eng.export(o.value, CUDA_DEVICE))
    check(out.data_ptr() == eng.data(o.value), f"attention {dt}: the output handed to torch without a copy")
    qh, kh, vh = (a.transpose(1, 2).double() for a in (q, k, v_))
    ref = torch.softmax(qh @ kh.transpose(-1, -2) / D ** 0.5, dim=-1) @ vh
    err = (out.double() - ref).abs().max().item()
    tol = {"f16": 4e-3, "bf16": 1.6e-2, "f32": 1e-5}[dt]
    check(out.shape == (B, H, L, D) and out.dtype == q.dtype and err < tol, f"attention {dt}: max error {err}")
    for h in (tq, tk, tv, o.value):
        eng.release(h)
    del out

# refused imports leave the capsule to torch
for name, x, word in [("int64", torch.arange(6, device=dev), "int64"),
                      ("complex", torch.zeros(3, device=dev, dtype=torch.complex64), "complex")]:
    cap = tdl.to_dlpack(x)
    try:
        eng.from_capsule(cap)
        check(False, f"{name}: accepted")
    except fd.FaError as e:
        check("fa_tensor_from_dlpack" in e.message and word in e.message, f"{name}: message {e.message!r}")
    check(fd.capsule_name(cap) == fd.DLTENSOR, f"{name}: the capsule is left to torch")
    del cap

# ---- engine -> torch -----------------------------------------------------------
def export_case(name, t, want_dtypes, want, device=CUDA_DEVICE, via_capsule=False):
    before = eng.memory(fd.FA_CPU)
    sync()
    ex = eng.export(t, device)
    x = tdl.from_dlpack(ex.capsule) if via_capsule else torch.from_dlpack(ex)
    check(ex.consumed(), f"{name}: torch took the capsule")
    del ex
    check(x.dtype in want_dtypes, f"{name}: dtype {x.dtype}, expected one of {want_dtypes}")
    if device[0] == fd.kDLCUDA:
        check(x.device == dev, f"{name}: device {x.device}")
    check(tuple(x.shape) == eng.shape(t) and all(a == b for a, b, n in zip(x.stride(), eng.strides(t), x.shape)
                                               if n > 1), f"{name}: shape {tuple(x.shape)}, strides {x.stride()}")
    check(x.data_ptr() == eng.data(t), f"{name}: zero copy: {x.data_ptr():#x} vs {eng.data(t):#x}")
    eng.release(t)  # torch's tensor keeps the storage
    check(torch_values(x) == want, f"{name}: values")
    del x
    gc.collect()
    check(eng.memory(fd.FA_CPU) < before, f"{name}: the export's record and the tensor freed with torch's")


vals = [float(i) for i in range(48)]
for dt, tdt in TORCH_DTYPES.items():
    if dt == "bool":  # kDLBool with a DLPack >= 0.8 header, else uint8
        export_case("bool", eng.arange([48], "bool", fd.FA_CUDA), (torch.uint8, torch.bool), [0.0] + [1.0] * 47)
    else:
        export_case(dt, eng.arange([2, 3, 8], dt, fd.FA_CUDA), (tdt,), vals)
t = eng.arange([2, 3, 8], "f32", fd.FA_CUDA)
export_case("transposed view", eng.view("fa_tensor_transpose", t, 0, 2), (torch.float32,),
            torch_values(torch.arange(48.0).reshape(2, 3, 8).transpose(0, 2)), via_capsule=True)
export_case("narrowed view", eng.view("fa_tensor_narrow", t, 2, 3, 4), (torch.float32,),
            torch_values(torch.arange(48.0).reshape(2, 3, 8)[:, :, 3:7]))
eng.release(t)
export_case("cpu", eng.arange([5], "f64", fd.FA_CPU), (torch.float64,), [0.0, 1.0, 2.0, 3.0, 4.0], (fd.kDLCPU, 0))

# torch's writes to an exported tensor are the engine's
t = eng.arange([8], "f32", fd.FA_CUDA)
sync()
x = torch.from_dlpack(eng.export(t, CUDA_DEVICE))
x.mul_(2)
torch.cuda.synchronize()
check(eng.values(t) == [2.0 * i for i in range(8)], "torch's write to an exported tensor seen by the engine")
del x
eng.release(t)

# an export nobody takes frees its tensor
t = eng.arange([8], "f32", fd.FA_CUDA)
ex = eng.export(t, CUDA_DEVICE)
eng.release(t)
del ex

gc.collect()
sync()
mem = eng.memory(fd.FA_CUDA), eng.memory(fd.FA_CPU)
check(mem == mem0, f"engine memory (cuda, cpu) {mem} at the end, {mem0} at the start")
eng.close()
sys.exit(check.summary("gpu_dlpack_check", f"torch {torch.__version__} on {torch.cuda.get_device_name(dev)}: "))
