"""Train the small GPT with DDP and gradient accumulation (zbkit.parallel's "ddp" backend).

    # CPU, 2 ranks (gloo)
    torchrun --standalone --nproc-per-node 2 examples/ddp_accumulation.py --backend gloo
    # GPUs (nccl, rank k on cuda:LOCAL_RANK), e.g. 4
    torchrun --standalone --nproc-per-node 4 examples/ddp_accumulation.py --backend nccl

Options: ``--steps`` (optimizer steps), ``--accum`` (micro-batches per optimizer step,
default 4), ``--batch`` (rows per micro-batch per rank). ``--backend`` defaults to nccl when
CUDA is available, else gloo.

Every rank trains on its own micro-batches; the optimizer steps once per window of
``--accum`` of them. Only a window's last backward all-reduces the gradients (the others run
under DDP's ``no_sync``), so ``backend.comm_stats`` counts ``--steps`` synchronising backwards,
not ``--steps x --accum``. After each window every rank holds the gradient of the mean loss over
the window's micro-batches of all ranks, what one process would get on all that data.
Rank 0 prints that mean loss per optimizer step, then the communication counts.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from _gpt import add_backend_argument, build_model, counting_batch, cross_entropy, start_rank

from zbkit.parallel import create_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--batch", type=int, default=8, help="rows per micro-batch per rank")
    parser.add_argument("--lr", type=float, default=0.5)
    add_backend_argument(parser)
    args = parser.parse_args()

    start_rank(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model()
    # plain SGD: a step proportional to the gradient, so a gradient averaged wrongly (over
    # microbatches, replicas or a window) shows in the loss
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.5, total_iters=args.steps)
    # this rank's micro-batches: batch i of the run is micro-batch i % accum of window i // accum
    loader = [counting_batch(args.batch, i, replica=rank) for i in range(args.steps * args.accum)]

    backend = create_backend("ddp", grad_accum_steps=args.accum)
    model, optimizer, loader, scheduler = backend.prepare(model, optimizer, loader, scheduler)
    device = backend.device  # where prepare put the model: cpu, or cuda:LOCAL_RANK
    window_loss = torch.zeros((), device=device)
    for x, y in loader:
        with backend.accumulate(model):  # no_sync() unless this micro-step ends the window
            loss = cross_entropy(model(x.to(device)), y.to(device))  # (batch, TOKENS, VOCAB)
            backend.backward(loss)  # loss / window length: the window's gradients average
            optimizer.step()  # these three act only on the window's last micro-step
            scheduler.step()
            optimizer.zero_grad()
        window_loss += loss.detach() / backend.window_length
        if backend.sync_gradients:  # the window is over: report its mean over all ranks
            dist.all_reduce(window_loss)
            if rank == 0:
                step = backend.optimizer_steps - 1
                print(f"step {step} loss {window_loss.item() / world:.6f}", flush=True)
            window_loss.zero_()

    stats = backend.comm_stats
    if rank == 0:
        print(
            f"comm_stats: {stats.reductions} all-reduces, {stats.bytes} bytes, per "
            f"synchronising backward {stats.per_backward} ({args.steps} optimizer steps of "
            f"{args.accum} micro-batches on {world} {args.backend} ranks)",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
