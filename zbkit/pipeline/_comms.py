"""Point-to-point transfers of one step's tensors, following the plan (``schedules.plan``).

The plan (``derive_plan``) says which tensors go where and when; this module moves them.
On the wire every message has a fixed tag computed from (what, stage, microbatch), so a
receive matches its send whatever order the two ranks reach them in (gloo matches on
(peer, tag) in order; NCCL ignores tags, so there the plan's per-pair order is what matches).

The names, shapes and dtypes of an edge are agreed once: the first message on it (in the
first step) is preceded by a small shape message, and both ends cache what it said. Later
steps send tensors only, so a hop costs what a bare ``send``/``recv`` costs. The sender checks
every message against the agreed shapes and names a change instead of letting the receiver
read a wrongly sized buffer; a new batch shape needs ``forget_shapes()`` on every rank.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from zbkit.parallel.process_group import new_group
from zbkit.pipeline._shapes import META_BYTES, Meta, pack, unpack
from zbkit.schedules.action import Product
from zbkit.schedules.plan import Comm, CommOp

_KIND_TAG = {Product.ACT: 0, Product.GRAD: 1}
_SLOTS = 64  # tags per message: tensor i of a message uses tag base * _SLOTS + i
_META_BASE = 1 << 30  # the shape messages (once per edge) use tags above this


class CommTimeout(TimeoutError):
    """A receive or a send did not complete: in time, or because the connection to its peer
    failed (the peer rank failed or exited); the message names the action and says which."""


class P2P:
    """Moves one step's tensors between this rank and its pipeline neighbours.

    ``group`` is the pipeline's process group; peers are ranks in it. On gloo every tensor is
    its own ``isend``/``irecv`` (``batch_isend_irecv`` misbehaves on gloo); on NCCL the
    tensors of one message go in one ``batch_isend_irecv``.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        num_stages: int,
        microbatches: int,
        device: torch.device,
        timeout: float,
        who: str,
    ) -> None:
        self.group = group
        self.device = device
        self._seconds = timeout
        self.who = who  # who speaks in every error, e.g. "rank 1"
        self.batched = dist.get_backend(group) == "nccl"
        # NCCL runs the p2p ops between two ranks in issue order on one stream and ignores
        # tags, so activations (flowing down) and gradients (flowing up) get a communicator
        # each: otherwise a send of activations could wait behind a receive of gradients
        # that waits for it. Gloo matches by tag: one group serves both.
        self._channel = dict.fromkeys(Product, group)
        if self.batched:
            ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            for what in self._channel:
                self._channel[what] = new_group(ranks, members_only=True)
        self._num_stages = num_stages
        self._microbatches = microbatches
        if 2 * num_stages * microbatches * _SLOTS >= _META_BASE:
            raise ValueError(
                f"{num_stages} stages x {microbatches} microbatches is too many for the tag space"
            )
        self._sent_meta: dict[tuple[str, int], Meta] = {}
        self._recv_meta: dict[tuple[str, int], Meta] = {}
        # sends not yet waited, with what they send (kept alive until the wire is done)
        self._pending: list[tuple[list, Comm, torch.Tensor | list[torch.Tensor]]] = []
        self._early_meta: dict[tuple[str, int], tuple[list, torch.Tensor]] = {}
        # per transfer, once its edge's shapes are agreed: what to check and where to send /
        # the buffers to receive into (kept across steps)
        self._sends: dict[Comm, tuple] = {}
        self._recvs: dict[Comm, tuple] = {}
        self._wait_for = datetime.timedelta(seconds=timeout)
        pg = group if group is not None else dist.group.WORLD  # peers: group ranks
        assert pg is not None, "get_backend above needs an initialised process group"
        self._pg = pg

    @property
    def timeout(self) -> float:
        """Seconds one wait may block; settable between steps."""
        return self._seconds

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._seconds = seconds
        self._wait_for = datetime.timedelta(seconds=seconds)

    def forget_shapes(self) -> None:
        """The next step agrees names, shapes and dtypes afresh (another batch size).
        Every rank of the pipeline must call it before the same step."""
        self._sent_meta.clear()
        self._recv_meta.clear()
        self._early_meta.clear()
        self._sends.clear()
        self._recvs.clear()

    # ------------------------------------------------------------------ tags and peers
    def _tag(self, comm: Comm, index: int) -> int:
        base = (_KIND_TAG[comm.what] * self._num_stages + comm.stage) * self._microbatches
        return (base + comm.microbatch) * _SLOTS + index

    def _meta_tag(self, comm: Comm) -> int:
        return _META_BASE + _KIND_TAG[comm.what] * self._num_stages + comm.stage

    def _global(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    # ------------------------------------------------------------------ send
    def send(self, comm: Comm, tensors: dict[str, torch.Tensor | None]) -> None:
        """Posts the sends of one message; they complete while this rank computes on.

        Once this transfer's shapes are agreed, its tags and peer are kept (a "route") and a
        send only checks each tensor against them and posts it: a hop costs about what a bare
        ``isend`` costs.
        """
        route = self._sends.get(comm)
        if route is not None and len(route[0]) == 1 == len(tensors) and not self.batched:
            # one tensor (the common case), in as few Python steps as possible: a small hop
            # is a few tens of microseconds, and every step here showed in it
            t = tensors.get(route[0][0])
            if (
                t is not None
                and t.shape == route[1][0]
                and t.dtype == route[2][0]
                and t.requires_grad == route[3][0]
                and t.is_contiguous()
            ):
                self._pending.append(([self._pg.send([t], comm.peer, route[4][0])], comm, t))
                return
        if route is not None and len(tensors) == len(route[0]):
            names, shapes, dtypes, grads, tags, peer = route
            data = []
            for k, shape, dtype, rg in zip(names, shapes, dtypes, grads, strict=True):
                t = tensors.get(k)
                if t is None or t.shape != shape or t.dtype != dtype or t.requires_grad != rg:
                    break  # not as agreed: the full path names what changed
                data.append(t if t.is_contiguous() else t.contiguous())
            else:
                if self.batched:
                    self._post(CommOp.SEND, comm, data, tags)
                    return
                # the group's own send: dist.isend's Python checks cost ~4 us a call, which
                # showed in a small hop (the route was checked above)
                send, group_peer = self._pg.send, comm.peer
                works = [send([t], group_peer, tag) for t, tag in zip(data, tags, strict=True)]
                self._pending.append((works, comm, data))  # alive until the wire is done
                return
        self._send_checked(comm, tensors)

    def _send_checked(self, comm: Comm, tensors: dict[str, torch.Tensor | None]) -> None:
        """The first send of a transfer (agreeing or checking the edge's shapes), a bad one,
        or one carrying ``None`` values (their names are in the agreed shapes; no data)."""
        meta = Meta.of(tensors)
        if len(meta.names) > _SLOTS:
            raise ValueError(f"{self.who}: {comm} carries {len(meta.names)} tensors (max 64)")
        agreed = self._sent_meta.get((comm.what, comm.stage))
        if agreed is None:
            self._sent_meta[(comm.what, comm.stage)] = meta
            self._post(CommOp.SEND, comm, [pack(meta, self.device)], [self._meta_tag(comm)])
        elif meta != agreed:
            raise ValueError(
                f"{self.who}: {comm} has tensors {{{meta.describe()}}} but the first "
                f"message on that edge had {{{agreed.describe()}}}. Shapes are agreed once, on "
                "the first step: every microbatch of a stage must produce the same names, "
                "shapes and dtypes; for a new batch shape call runner.forget_shapes() on every "
                "rank before the step"
            )
        # the wire reads the data only
        data = [t.contiguous() for k in meta.names if (t := tensors[k]) is not None]
        tags = [self._tag(comm, i) for i in range(len(data))]
        self._post(CommOp.SEND, comm, data, tags)
        if meta.nones:
            return  # no fast route: the route's checks know tensors only
        shapes = tuple(torch.Size(x) for x in meta.shapes)
        route = (meta.names, shapes, meta.dtypes, meta.requires_grad, tags)
        self._sends[comm] = (*route, self._global(comm.peer))

    # ------------------------------------------------------------------ recv
    def recv(self, comm: Comm) -> dict[str, torch.Tensor | None]:
        """Receives one message; blocks at most ``timeout`` seconds per tensor.

        The receive is posted when its turn comes, not ahead: on gloo a receive posted ahead
        of its turn was seen to stall its message by 3-5 ms (benchmarks/pipeline_vs_torch.py),
        while a message that arrives first simply waits for its receive.
        """
        route = self._recvs.get(comm) or self._recv_route(comm)
        names, bufs, floats, grads, tags, peer, nones = route
        if nones:  # a tuple's None places: no data on the wire, None on arrival
            return {**self._recv_tensors(comm, route), **dict.fromkeys(nones)}
        return self._recv_tensors(comm, route)

    def _recv_tensors(self, comm: Comm, route: tuple) -> dict[str, torch.Tensor | None]:
        names, bufs, floats, grads, tags, peer, _ = route
        if len(bufs) == 1 and not self.batched:  # one tensor: as few steps as possible
            work = self._pg.recv(bufs, comm.peer, tags[0])
            try:
                work.wait(self._wait_for)
            except RuntimeError as exc:
                raise self._timeout(comm, exc) from exc
            b = bufs[0].detach()
            return {names[0]: b.requires_grad_(grads[0]) if floats[0] else b}
        if self.batched:
            works = self._post(CommOp.RECV, comm, bufs, tags)
        else:  # the group's own receive, as for sends
            recv, group_peer = self._pg.recv, comm.peer
            works = [recv([b], group_peer, tag) for b, tag in zip(bufs, tags, strict=True)]
        self._wait(works, comm)
        # The received tensors start a new graph on this stage: fresh leaves (that collect a
        # gradient) over the transfer's buffers, which the next step receives into again
        return {
            k: b.detach().requires_grad_(rg) if f else b.detach()
            for k, b, f, rg in zip(names, bufs, floats, grads, strict=True)
        }

    def _recv_route(self, comm: Comm) -> tuple:
        """This transfer's names, buffers, tags and peer, once the edge's shapes are known.

        One set of buffers per transfer, kept across steps (as torch's stages do): a fresh
        allocation per message costs more than the message on small stages. Safe because a
        step's received tensors are dead when the step ends (the stage freed them).
        """
        key = (comm.what, comm.stage)
        meta = self._recv_meta.get(key)
        if meta is None:
            early = self._early_meta.pop(key, None)
            works, buf = early or self._post_meta_recv(comm)
            self._wait(works, comm)
            meta = self._recv_meta[key] = unpack(buf)
        bufs = [
            torch.empty(shape, dtype=dtype, device=self.device)
            for shape, dtype in zip(meta.shapes, meta.dtypes, strict=True)
        ]
        floats = tuple(b.is_floating_point() for b in bufs)
        tags = [self._tag(comm, i) for i in range(len(bufs))]
        peer = self._global(comm.peer)
        route = (meta.names, bufs, floats, meta.requires_grad, tags, peer, meta.nones)
        self._recvs[comm] = route
        return route

    def expect(self, comms: list[Comm]) -> None:
        """Step start: post the shape message of every edge this rank will receive on whose
        shapes are not agreed yet, so each arrives while the rank computes (gloo only; first
        step only). Once agreed, nothing is posted: no receive outlives its step."""
        if self.batched:
            return
        for comm in comms:
            key = (comm.what, comm.stage)
            known = key in self._recv_meta or key in self._early_meta  # agreed, or coming
            if comm.op is CommOp.RECV and not known:
                self._early_meta[key] = self._post_meta_recv(comm)

    def _post_meta_recv(self, comm: Comm) -> tuple[list, torch.Tensor]:
        buf = torch.empty(META_BYTES, dtype=torch.uint8, device=self.device)
        return self._post(CommOp.RECV, comm, [buf], [self._meta_tag(comm)]), buf

    # ------------------------------------------------------------------ plumbing
    def _post(self, op: CommOp, comm: Comm, tensors: list[torch.Tensor], tags: list[int]) -> list:
        peer = self._global(comm.peer)
        fn = dist.isend if op is CommOp.SEND else dist.irecv
        if not tensors:  # a message with no tensors (e.g. no input needed a gradient)
            return []
        works: list
        try:  # posting to a peer that has gone fails here, before any wait
            if self.batched:
                pairs = zip(tensors, tags, strict=True)
                channel = self._channel[comm.what]
                ops = [dist.P2POp(fn, t, peer, channel, tag) for t, tag in pairs]
                works = dist.batch_isend_irecv(ops)
            else:
                pairs = zip(tensors, tags, strict=True)
                works = [fn(t, peer, group=self.group, tag=tag) for t, tag in pairs]
        except RuntimeError as exc:
            raise self._timeout(comm, exc) from exc
        if op is CommOp.SEND:  # keep the tensors alive until the wire is done with them
            self._pending.append((works, comm, tensors))
        return works

    def _wait(self, works: list, comm: Comm) -> None:
        for work in works:
            try:
                work.wait(self._wait_for)
            except RuntimeError as exc:
                raise self._timeout(comm, exc) from exc

    def _timeout(self, comm: Comm, exc: Exception) -> CommTimeout:
        # Every failed wait lands here, and only some are timeouts: when the peer fails and
        # its connection closes, the wait fails at once, and "gave up after 60 s" would send
        # the learner looking for a hang. The transport's own words tell the two apart.
        detail = str(exc).strip()
        if detail.startswith("[") and "] " in detail:  # gloo's "[path/pair.cc:553] " prefix
            detail = detail.split("] ", 1)[1]
        detail = detail.split(". ", 1)[0][:200]  # the first sentence says what happened
        if "timed out" in detail.lower() or "timeout" in detail.lower():
            text = (
                f"{self.who}: gave up after {self.timeout:g} s {comm.explain()}. Rank "
                f"{comm.peer} may have failed (see its error), be stuck earlier in its "
                "program, or run another schedule."
            )
        else:
            text = (
                f"{self.who}: the connection to rank {comm.peer} failed while "
                f"{comm.explain()} (not a timeout): rank {comm.peer} probably failed or "
                "exited; its own error is the cause."
            )
        return CommTimeout(f"{text} [{detail}]")

    def finish(self) -> None:
        """End of step: every posted send has completed (nothing pending on the wire)."""
        pending, self._pending = self._pending, []
        for works, comm, _ in pending:
            self._wait(works, comm)

    @property
    def pending(self) -> int:
        """Sends not yet completed plus receives posted ahead: 0 after a good step."""
        return len(self._pending) + len(self._early_meta)
