"""The bf16 matmul rate of this GPU, measured the same way in every peers_*.py
run (8192^3, Triton's do_bench median), so that a table's TFLOP/s can be read as
a fraction of what the card's tensor cores give in the same run."""
import torch
from triton.testing import do_bench

MATMUL_N = 8192


def matmul_tflops(warmup=25, rep=100):
    """(8192 x 8192) @ (8192 x 8192) in bf16: (TFLOP/s, median ms); the operands freed on return."""
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=warmup, rep=rep, return_mode="median")
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * MATMUL_N ** 3 / (ms * 1e-3) / 1e12, ms
