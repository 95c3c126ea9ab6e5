"""DDP on 2 gloo ranks: time and all-reduce bytes per epoch, k=4 against k=1 (paired runs).

Prints ratios measured side by side in the same processes; no absolute claims.
"""

import statistics
import time


def rank_bench(repeats: int = 5, micro_batches: int = 32) -> dict:
    import torch
    from torch import nn

    from zbkit.parallel import create_backend

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = [(torch.randn(8, 256), torch.randn(8, 256)) for _ in range(micro_batches)]

    def epoch(k: int) -> tuple[float, int]:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 256)
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        backend = create_backend("ddp", grad_accum_steps=k)
        model, opt, loader, _ = backend.prepare(model, opt, data)
        torch.distributed.barrier()
        t0 = time.perf_counter()
        for x, y in loader:
            with backend.accumulate(model):
                backend.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
        torch.distributed.barrier()
        return time.perf_counter() - t0, backend.comm_stats.bytes

    epoch(1)  # warm-up
    ratios, byte_ratios = [], []
    for _ in range(repeats):
        t1, b1 = epoch(1)
        t4, b4 = epoch(4)
        ratios.append(t4 / t1)
        byte_ratios.append(b4 / b1)
    return {
        "time_ratio": statistics.median(ratios),
        "bytes_ratio": statistics.median(byte_ratios),
        "all_time_ratios": ratios,
    }


if __name__ == "__main__":
    from zbkit.launch import launch

    res = launch(rank_bench, nprocs=2, backend="gloo", timeout=600)
    for r, out in enumerate(res):
        print(
            f"rank {r}: epoch time k=4/k=1 median {out['time_ratio']:.3f} "
            f"(runs {[round(x, 3) for x in out['all_time_ratios']]}), "
            f"all-reduce bytes k=4/k=1 {out['bytes_ratio']:.3f}"
        )
