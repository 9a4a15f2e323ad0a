"""Compiles FlashInfer's decode kernels (JIT, CPU-bound) ahead of `pagedlab bench decode`.

Run in the background while the GPU tests run; the compiled modules land in FlashInfer's cache
($FLASHINFER_WORKSPACE_BASE) and the benchmark process finds them there.
"""
import time

import torch

t0 = time.time()
import flashinfer  # noqa: E402

print("flashinfer", getattr(flashinfer, "__version__", "?"), flush=True)
page, hkv, d = 16, 8, 128
for hq in (32, 64):
    for tc in (False, True):
        ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tc)
        indptr = torch.tensor([0, 2], dtype=torch.int32, device="cuda")
        indices = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
        last = torch.tensor([5], dtype=torch.int32, device="cuda")
        w.plan(indptr, indices, last, hq, hkv, d, page, pos_encoding_mode="NONE",
               q_data_type=torch.float16, kv_data_type=torch.float16, sm_scale=d ** -0.5)
        k = torch.randn(2, hkv, page, d, dtype=torch.float16, device="cuda")
        out = w.run(torch.randn(1, hq, d, dtype=torch.float16, device="cuda"), (k, k.clone()))
        torch.cuda.synchronize()
        print(f"hq={hq} tc={tc}: ok {tuple(out.shape)} after {time.time() - t0:.0f} s", flush=True)
