"""Counting gradient reductions: a DDP comm hook that logs, then averages as usual.

DDP groups gradients into buckets and, once every gradient in a bucket is ready,
all-reduces the bucket's flat buffer. A comm hook replaces that all-reduce; ours counts
the call and its bytes, then does exactly what DDP's default does (divide by the world
size, sum across ranks), so training is unchanged. Under `no_sync()` DDP calls no hook
at all, which is how a notebook can *see* accumulation divide communication by k.
"""

# No `from __future__ import annotations` here: DDP's register_comm_hook inspects the
# hook's annotations at runtime and wants the real dist.GradBucket / Future classes.
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    """Running totals of the gradient reductions one model has issued on this rank."""

    op: str = "all_reduce"  # ddp: all_reduce per bucket; fsdp: reduce_scatter per shard group
    reductions: int = 0  # ddp: one per bucket per synchronising backward
    bytes: int = 0  # full gradient payload entering the reductions (bucket buffer sizes)
    buckets_seen: set[int] = field(default_factory=set)  # bucket indices that were reduced
    # all-reduces of each synchronising backward. DDP's first one uses a single bucket
    # holding every gradient; it then rebuilds buckets (<= bucket_cap_mb each) in the
    # order gradients became ready, so with small caps this reads [1, n, n, ...].
    per_backward: list[int] = field(default_factory=list)
    process_group: dist.ProcessGroup | None = field(default=None, repr=False)
    _in_backward: int = field(default=0, repr=False)

    def reset(self) -> None:
        self.reductions = self.bytes = self._in_backward = 0
        self.buckets_seen.clear()
        self.per_backward.clear()


def counting_allreduce_hook(
    stats: CommStats, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: count this bucket, then average it across ranks like DDP's default."""
    buffer = bucket.buffer()  # flat 1-D tensor: this bucket's gradients side by side
    stats.reductions += 1
    stats.bytes += buffer.numel() * buffer.element_size()
    stats.buckets_seen.add(bucket.index())
    stats._in_backward += 1
    if bucket.is_last():  # the backward's last bucket: close its tally
        stats.per_backward.append(stats._in_backward)
        stats._in_backward = 0

    group = stats.process_group if stats.process_group is not None else dist.group.WORLD
    # Divide before summing (as DDP does) so low-precision gradients don't overflow.
    buffer.div_(dist.get_world_size(group))
    work = dist.all_reduce(buffer, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def count_reduce_scatter(stats: CommStats, world_size: int, reduce_output: torch.Tensor) -> None:
    """FSDP all-reduce hook (FSDP-only: it sees each reduce-scatter's output shard).

    The shard is 1/world of the padded flat gradient that entered the reduce-scatter, so
    the payload is world_size times its size. It only observes; FSDP already averaged.
    """
    stats.reductions += 1
    stats.bytes += reduce_output.numel() * reduce_output.element_size() * world_size
