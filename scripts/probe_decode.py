"""Decode: where a call's time goes.  The kernels' own times (torch.profiler, CUPTI: every kernel in the
process) and the cost of a call in a loop (wall clock over 2000 calls, host and GPU together), for the
engine's decode kernel (C API through ctypes, as bench_layouts.py) and PyTorch SDPA's cuDNN and flash
backends on the same shapes (bf16, D = 128, Hq = 32).

Usage (on the GPU machine, after scripts/gpu_env.sh and a build):
  python3 scripts/probe_decode.py build-gpu/libflashattn.so
"""
import sys, os, time, ctypes
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from bench_layouts import EngineCall
from oracle_attention import Engine
eng = Engine(sys.argv[1])
def kernel_times(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    return [(e.key[:60], e.device_time_total / n) for e in prof.key_averages() if e.device_time_total > 0]
def wall_us(fn, n=2000):
    for _ in range(10): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
for (B, Hkv, Lq, Lk) in [(1, 8, 1, 256), (1, 8, 1, 4096), (1, 8, 1, 131072), (8, 8, 1, 32768), (8, 8, 4, 32768), (8, 8, 16, 32768), (64, 8, 1, 32768)]:
    Hq, D = 32, 128
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16)
    o = torch.empty(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16)
    call = EngineCall(eng, "bf16", q, k, v, o, False)
    kt = kernel_times(call)
    gb = 2 * B * Hkv * Lk * D * 2 / 1e9
    tot = sum(t for _, t in kt)
    print(f"== B={B} Hkv={Hkv} Lq={Lq} Lk={Lk}: engine wall {wall_us(call):.1f} us/call, kernels {tot:.1f} us ({gb / tot * 1e6:.0f} GB/s)")
    for n, t in kt: print(f"     {n:60} {t:8.1f} us")
    for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        try:
            with sdpa_kernel([be]):
                f = lambda: sdpa(q, k, v, enable_gqa=True)
                kt = kernel_times(f); tot = sum(t for _, t in kt)
                print(f"   {be.name}: wall {wall_us(f):.1f} us/call, kernels {tot:.1f} us ({gb / tot * 1e6:.0f} GB/s)")
        except RuntimeError as e:
            print(f"   {be.name}: refused ({str(e)[:60]})")
    call.close()
    del q, k, v, o
    torch.cuda.empty_cache()

# A decode step captured into a CUDA graph on the host's stream (API §8): the engine's context on a
# torch stream, opts.out given (a graph replays into fixed memory), chunks of keys (splits > 1: the
# chunks' temporary buffer is allocated and freed inside the graph); the replay must equal a direct
# call, bit for bit, and costs the host one graph launch.  Then the same with kv_lens and alibi from
# host arrays, which the call queues in a kernel's parameters (fa_cuda_upload): the graph keeps the
# values of the capture, so the host's arrays are changed after it and the replay must still equal
# the direct call made with the first values.
def capture_check(label, host_arrays):
    B, Hkv, Lq, Lk, Hq, D = 1, 8, 1, 4096, 32, 128
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        geng = Engine(sys.argv[1])
        q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16)
        o = torch.empty(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16)
        call = EngineCall(geng, "bf16", q, k, v, o, False)
        lens = slopes = None
        if host_arrays:
            lens = (ctypes.c_int64 * B)(*[Lk - 1000] * B)
            slopes = (ctypes.c_double * Hq)(*[2.0 ** (-8.0 * (h + 1) / Hq) for h in range(Hq)])
            call.opts.kv_lens, call.opts.n_kv_lens = lens, B
            call.opts.alibi, call.opts.n_alibi = slopes, Hq
        call()
        side.synchronize()
        direct = o.clone()
        o.fill_(float("nan"))
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, stream=side):
                call()
            if host_arrays:  # the replay keeps the captured values
                for b in range(B): lens[b] = 7
                for h in range(Hq): slopes[h] = 0.5
            g.replay()
            side.synchronize()
            same = torch.equal(o, direct)
            for _ in range(10): g.replay()
            side.synchronize(); t = time.perf_counter()
            for _ in range(2000): g.replay()
            side.synchronize()
            print(f"graph capture{label}: replay equal to the direct call: {same}; "
                  f"{(time.perf_counter() - t) / 2000 * 1e6:.1f} us a replayed step (B={B} Hkv={Hkv} Lk={Lk})")
        except Exception as e:  # the capture itself failed: say why
            print(f"graph capture{label} FAILED: {e}")
        call.close()


capture_check("", False)
capture_check(" with kv_lens and alibi from host arrays", True)
