"""Point-to-point transfers of one step's tensors, following the plan (``schedules.core.plan``).

The plan (``derive_plan``) says which tensors go where and when; this module moves them.
On the wire every message has fixed tags computed from (what, stage, microbatch), so a
receive matches its send whatever order the two ranks reach them in (gloo matches on
(peer, tag) in order; NCCL ignores tags, so there the plan's per-pair order is what matches).

What a message carries (its layout: names, shapes, dtypes, requires_grad, None places) may
change from one microbatch to the next and between steps: a Hugging Face stage returns a
mask that is None for a microbatch without padding, a tensor for one with padding. So every
message starts with a header, one int64 on a tag of its own:

    header = k >= 0   the transfer's layout number k, known to both ends; the tensors follow
    header = NEW      a shape message follows (JSON, ``_shapes.py``; numbered), then the tensors
    header = FAIL     the sender failed: its error follows as text; the receive raises it

Both ends number a transfer's layouts alike (one message per transfer and step, so both see
them in the same order), and a receiver keeps one set of buffers per transfer, for the
layout it last received. On gloo it posts those buffers with the header's receive, a guess
that the layout repeats; and when that layout's first tensor is small (the hops where a
round trip shows) the header rides in front of it, copied into one message: a repeated
layout (the steady state) costs what a bare send per tensor costs. If the guess is wrong the
sender answers where the guess expects its header, with an empty message for each other
guessed receive (gloo lets a message be shorter than its buffer), then sends the right
tensors. NCCL posts the tensors after a header of their own: simple, one more round trip.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from zbkit.parallel.process_group import new_group
from zbkit.pipeline._shapes import (
    MAX_TENSORS,
    META_BYTES,
    Meta,
    from_bytes_tensor,
    pack,
    read,
    to_bytes_tensor,
    unsendable,
)
from zbkit.schedules.core.action import Product
from zbkit.schedules.core.plan import Comm, CommOp

_KIND_TAG = {Product.ACT: 0, Product.GRAD: 1}
_SLOTS = MAX_TENSORS  # tags per message: tensor i of a message uses tag base * _SLOTS + i
_META_BASE = 1 << 30  # headers and notes (shape messages, error texts) use tags above this
NEW, FAIL = -1, -2  # header codes besides a layout's number
MAX_LAYOUTS = 64  # layouts remembered per transfer; one more and both ends start afresh
_HEAD_BYTES = 16  # a header: int64 code, int64 0 (16 bytes keep any dtype after it aligned)
_RIDE_BYTES = 1 << 16  # a first tensor up to this size carries the header (one copy)


class CommTimeout(TimeoutError):
    """A receive or a send did not complete: in time, because the connection to its peer
    failed (the peer rank failed or exited), or because the peer failed and said so; the
    message names the action and says which. ``origin``: the error the peer sent, if any."""

    def __init__(self, message: str, origin: str | None = None, peer: int | None = None):
        super().__init__(message)
        self.origin = origin  # the failing rank's own words, passed on unchanged
        self.peer = peer  # the rank this rank waited on


class _SendRoute(NamedTuple):
    """A transfer's last layout on the sending side: what to check, where to send."""

    layout: int  # its number in the transfer's table
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    grads: tuple[bool, ...]
    nones: tuple[str, ...]
    tags: list[int]
    header: torch.Tensor  # the header holding `layout`
    first: torch.Tensor | None  # gloo, a small first tensor: header + its bytes, one message
    payload: torch.Tensor | None  # the first tensor's place in `first`


class _RecvRoute(NamedTuple):
    """A transfer's last layout on the receiving side, with the buffers it receives into."""

    layout: int
    names: tuple[str, ...]
    bufs: list[torch.Tensor]  # with `first`, bufs[0] is a view into it
    floats: tuple[bool, ...]
    grads: tuple[bool, ...]
    nones: tuple[str, ...]
    tags: list[int]
    first: torch.Tensor | None  # as the sender's: the header's 16 bytes, then bufs[0]
    code: torch.Tensor | None  # the header in `first`, as int64[1]


def _with_header(meta: Meta, batched: bool, device: torch.device) -> tuple | None:
    """Gloo, a first tensor of at most _RIDE_BYTES: (buffer, first tensor's view in it), one
    message of the header's 16 bytes then the tensor's (aligned for every dtype)."""
    if batched or not meta.shapes:
        return None
    nbytes = torch.Size(meta.shapes[0]).numel() * meta.dtypes[0].itemsize
    if nbytes > _RIDE_BYTES:
        return None  # big: a header message of its own costs less than copying it
    buf = torch.zeros(_HEAD_BYTES + nbytes, dtype=torch.uint8, device=device)
    return buf, buf[_HEAD_BYTES:].view(meta.dtypes[0]).view(meta.shapes[0])


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
        # per transfer, its layouts by number: the sender's {meta: number}, the receiver's list
        self._sent_layouts: dict[Comm, dict[Meta, int]] = {}
        self._recv_layouts: dict[Comm, list[Meta]] = {}
        # per transfer, its last layout (kept across steps): the sender's checks, the
        # receiver's buffers (the guess it posts with the header)
        self._sends: dict[Comm, _SendRoute] = {}
        self._recvs: dict[Comm, _RecvRoute] = {}
        # sends not yet waited, with what they send (kept alive until the wire is done)
        self._pending: list[tuple[list, Comm, Any]] = []
        self._told: list[tuple[list, Comm, Any]] = []  # a failed step's sends, never waited
        self._codes: dict[int, torch.Tensor] = {}  # header tensors by value (read-only)
        self._head = torch.empty(2, dtype=torch.int64, device=device)  # one receive at a time
        self._empty = torch.empty(0, dtype=torch.uint8, device=device)  # answers a wrong guess
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
        """Drops every layout and buffer kept (layouts no longer need it: they may change
        at any message). Every rank of the pipeline must call it before the same step."""
        self._sent_layouts.clear()
        self._recv_layouts.clear()
        self._sends.clear()
        self._recvs.clear()

    # ------------------------------------------------------------------ tags and peers
    def _transfer(self, comm: Comm) -> int:
        base = (_KIND_TAG[comm.what] * self._num_stages + comm.stage) * self._microbatches
        return base + comm.microbatch

    def _tag(self, comm: Comm, index: int) -> int:
        return self._transfer(comm) * _SLOTS + index

    def _header_tag(self, comm: Comm) -> int:
        return _META_BASE + 2 * self._transfer(comm)

    def _note_tag(self, comm: Comm) -> int:  # a shape message or an error text
        return _META_BASE + 2 * self._transfer(comm) + 1

    def _global(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    def _code(self, value: int) -> torch.Tensor:
        code = self._codes.get(value)
        if code is None:
            code = self._codes[value] = torch.tensor([value, 0], device=self.device)
        return code

    # ------------------------------------------------------------------ send
    def send(self, comm: Comm, tensors: Mapping[str, Any]) -> None:
        """Posts the sends of one message; they complete while this rank computes on.

        A message in the transfer's last layout (the steady state) is checked against it
        and posted in as few Python steps as possible (a small hop is tens of microseconds,
        and every step here showed in it); on gloo a small first tensor carries the header
        (copied behind it: a message of its own would cost a round trip). Anything else
        goes the long way, ``_send_layout``.
        """
        route = self._sends.get(comm)
        if route is None or (data := _fits(route, tensors)) is None:
            self._send_layout(comm, tensors)
        elif self.batched:
            self._post(CommOp.SEND, comm, [route.header], [self._header_tag(comm)])
            self._post(CommOp.SEND, comm, data, route.tags)
        else:
            # the group's own send: dist.isend's Python checks cost ~4 us a call, which
            # showed in a small hop (the route was checked above)
            send, peer, tags = self._pg.send, comm.peer, route.tags
            if route.first is not None:  # the header, then the first tensor, in one message
                route.payload.copy_(data[0].detach())  # type: ignore[union-attr]
                works = [send([route.first], peer, tags[0])]
                works += [send([t], peer, tag) for t, tag in zip(data[1:], tags[1:], strict=True)]
            else:
                works = [send([route.header], peer, self._header_tag(comm))]
                works += [send([t], peer, tag) for t, tag in zip(data, tags, strict=True)]
            self._keep(works, comm, data)

    def _send_layout(self, comm: Comm, tensors: Mapping[str, Any]) -> None:
        """A message in another layout than the transfer's last: a header naming a known
        one, or NEW and its shape message; then the tensors. One that cannot travel is
        named (the runner then tells the receiver, ``tell``)."""
        reason = unsendable(tensors, self.device)
        meta = None if reason else Meta.of(tensors)
        table = self._sent_layouts.setdefault(comm, {})
        index = None if meta is None else table.get(meta)
        note = None
        if meta is not None and index is None:  # new: numbered, and its shape message made
            index = len(table) if len(table) < MAX_LAYOUTS else 0
            try:
                note = pack(meta, self.device, index)
            except ValueError as exc:  # the names and shapes are too long for one message
                reason = str(exc)
        if reason or meta is None or index is None:
            raise ValueError(f"{self.who}: refused {comm.explain()}: {reason}")
        if note is not None:
            if index == 0:
                table.clear()  # full (or empty): both ends start numbering afresh
            table[meta] = index
        self._signal(comm, NEW if note is not None else index)
        if note is not None:
            self._post(CommOp.SEND, comm, [note], [self._note_tag(comm)])
        tags = [self._tag(comm, i) for i in range(len(meta.names))]
        data = [_wire(t) for k in meta.names if (t := tensors[k]) is not None]
        self._post(CommOp.SEND, comm, data, tags)  # plain: the header went ahead
        first, payload = _with_header(meta, self.batched, self.device) or (None, None)
        if first is not None:
            first[:_HEAD_BYTES].view(torch.int64)[0] = index
        shapes = tuple(torch.Size(s) for s in meta.shapes)
        self._sends[comm] = _SendRoute(index, meta.names, shapes, meta.dtypes,
                                       meta.requires_grad, meta.nones, tags, self._code(index),
                                       first, payload)  # fmt: skip

    def _signal(self, comm: Comm, code: int) -> None:
        """A header that is not the receiver's guess (the transfer's last layout): where
        the guess expects its header, with an empty message for each other tensor it
        guessed (gloo lets a message be shorter than its buffer)."""
        route = self._sends.pop(comm, None)
        if route is None or self.batched:  # nothing guessed: the header on its own tag
            self._post(CommOp.SEND, comm, [self._code(code)], [self._header_tag(comm)])
            return
        tags = route.tags
        if route.first is not None:  # the guess reads its header from the first tensor's
            self._post(CommOp.SEND, comm, [self._code(code)], tags[:1])
            tags = tags[1:]
        else:
            self._post(CommOp.SEND, comm, [self._code(code)], [self._header_tag(comm)])
        self._post(CommOp.SEND, comm, [self._empty] * len(tags), tags)

    def tell(self, comms: list[Comm], text: str) -> None:
        """This rank's step failed: each send in ``comms`` (ones it will not make) carries
        ``text`` instead, so a peer waiting for any of them fails at once, saying why,
        instead of after its timeout. Peers that have gone are skipped.

        A gloo send completes only when its receiver takes it, and a process that exits
        first loses it (the peer then sees a closed connection, without the reason). So
        this waits, at most the timeout, until each peer has taken the first one it is
        told: the one it waits for, as a peer receives in the order this rank sends.
        """
        note = to_bytes_tensor(text.encode()[: META_BYTES - 4], META_BYTES, self.device)
        first: dict[int, tuple[list, Comm]] = {}
        for comm in comms:
            try:
                self._signal(comm, FAIL)
                works = self._post(CommOp.SEND, comm, [note], [self._note_tag(comm)])
            except CommTimeout:  # that peer has gone: nothing to tell
                continue
            first.setdefault(comm.peer, (works, comm))
        self._told += self._pending  # a broken step's sends: kept alive, never waited
        self._pending = []
        for works, comm in first.values():
            try:
                self._wait(works, comm)
            except CommTimeout:
                pass  # best effort: the peer may have failed too, or wait for another

    # ------------------------------------------------------------------ recv
    def recv(self, comm: Comm) -> dict[str, torch.Tensor | None]:
        """Receives one message; blocks at most ``timeout`` seconds per wait.

        The receive is posted when its turn comes, not ahead: on gloo a receive posted ahead
        of its turn was seen to stall its message by 3-5 ms (benchmarks/pipeline_vs_torch.py),
        while a message that arrives first simply waits for its receive.
        """
        route = self._recvs.get(comm)
        if self.batched:  # NCCL: the header first, then the tensors of the layout it names
            self._wait(self._post(CommOp.RECV, comm, [self._head], [self._header_tag(comm)]), comm)
            header = int(self._head[0].item())  # after the wait: the stream has written it
            if route is None or header != route.layout:
                route = self._layout(comm, header)
            self._wait(self._post(CommOp.RECV, comm, route.bufs, route.tags), comm)
            return _arrived(route)
        # gloo: the header with, a guess, the buffers of the transfer's last layout
        recv, peer = self._pg.recv, comm.peer
        if route is None:
            guess: list = []
            self._wait([recv([self._head], peer, self._header_tag(comm))], comm)
            header = int(self._head[0].item())
        elif route.first is not None:  # the header rides in the first tensor's message
            head = recv([route.first], peer, route.tags[0])
            guess = [
                recv([b], peer, t) for b, t in zip(route.bufs[1:], route.tags[1:], strict=True)
            ]
            self._wait([head], comm)
            header = int(route.code.item())  # type: ignore[union-attr]
        else:
            head = recv([self._head], peer, self._header_tag(comm))
            guess = [recv([b], peer, t) for b, t in zip(route.bufs, route.tags, strict=True)]
            self._wait([head], comm)
            header = int(self._head[0].item())
        if route is not None and header == route.layout:  # the steady state
            self._wait(guess, comm)
            return _arrived(route)
        if header != FAIL:
            self._wait(guess, comm)  # the sender answered each with an empty message
        route = self._layout(comm, header)
        works = [recv([b], peer, tag) for b, tag in zip(route.bufs, route.tags, strict=True)]
        self._wait(works, comm)
        return _arrived(route)

    def _layout(self, comm: Comm, header: int) -> _RecvRoute:
        """The route of the layout ``header`` names (reading its shape message if new),
        with fresh buffers, now this transfer's last; a FAIL raises the sender's error.

        One set of buffers per transfer, kept across steps (as torch's stages do) while the
        layout repeats: a fresh allocation per message costs more than the message on small
        stages. Safe because a step's received tensors are dead when the step ends.
        """
        table = self._recv_layouts.setdefault(comm, [])
        if header == FAIL:
            text = from_bytes_tensor(self._recv_note(comm)).decode(errors="replace")
            raise CommTimeout(
                f"{self.who}: rank {comm.peer} failed and told this rank, {comm.explain()}. "
                f"Its error: {text}",
                origin=text,
                peer=comm.peer,
            )
        if header == NEW:
            index, meta = read(self._recv_note(comm))
            if index > len(table):
                raise ValueError(f"{self.who}: {comm} got layout {index} of {len(table)} known")
            del table[index:]  # the sender started afresh (its table was full)
            table.append(meta)
        elif 0 <= header < len(table):
            index, meta = header, table[header]
        else:
            raise ValueError(
                f"{self.who}: {comm.explain()}: the header names layout {header}, which this "
                f"rank does not know ({len(table)} known). Did only some ranks call "
                "forget_shapes() before this step, or a failed step leave messages behind?"
            )
        bufs = [
            torch.empty(shape, dtype=dtype, device=self.device)
            for shape, dtype in zip(meta.shapes, meta.dtypes, strict=True)
        ]
        first, code = _with_header(meta, self.batched, self.device) or (None, None)
        if first is not None:  # bufs[0] lives behind the header
            bufs[0], code = code, first[:_HEAD_BYTES].view(torch.int64)[:1]
        floats = tuple(b.is_floating_point() for b in bufs)
        tags = [self._tag(comm, i) for i in range(len(bufs))]
        route = _RecvRoute(index, meta.names, bufs, floats, meta.requires_grad, meta.nones,
                           tags, first, code)  # fmt: skip
        self._recvs[comm] = route
        return route

    def _recv_note(self, comm: Comm) -> torch.Tensor:
        buf = torch.empty(META_BYTES, dtype=torch.uint8, device=self.device)
        self._wait(self._post(CommOp.RECV, comm, [buf], [self._note_tag(comm)]), comm)
        return buf

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
        if op is CommOp.SEND:
            self._keep(works, comm, tensors)
        return works

    def _keep(self, works: list, comm: Comm, tensors: list[torch.Tensor]) -> None:
        """Keeps a send's tensors alive until the wire is done with them. Sends already
        done are let go here, so their buffers are freed as the step goes, not all at its
        end."""
        still = []
        for entry in self._pending:
            if all(w.is_completed() for w in entry[0]):
                self._wait(entry[0], entry[1])  # returns at once (or raises: it failed)
            else:
                still.append(entry)
        still.append((works, comm, tensors))
        self._pending = still

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
        return CommTimeout(f"{text} [{detail}]", peer=comm.peer)

    def finish(self) -> None:
        """End of step: every posted send has completed (nothing pending on the wire)."""
        pending, self._pending = self._pending, []
        for works, comm, _ in pending:
            self._wait(works, comm)

    @property
    def pending(self) -> int:
        """Sends not yet completed: 0 after a good step."""
        return len(self._pending)


def _wire(t: torch.Tensor) -> torch.Tensor:
    """What the wire reads: the data only. Detached, since a send's work holds its tensor
    until it is waited, and a sent output's graph (with the activations it saves) is the
    stage's to free at its backward, not the wire's at the end of the step."""
    t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


def _fits(route: _SendRoute, tensors: Mapping[str, Any]) -> list[torch.Tensor] | None:
    """The tensors to send if ``tensors`` is in ``route``'s layout, else None."""
    _, names, shapes, dtypes, grads, nones, *_ = route
    if len(tensors) != len(names) + len(nones):
        return None
    data = []
    for k, shape, dtype, rg in zip(names, shapes, dtypes, grads, strict=True):
        t = tensors.get(k)
        if (
            not isinstance(t, torch.Tensor)
            or t.shape != shape
            or t.dtype != dtype
            or t.requires_grad != rg
        ):
            return None
        data.append(_wire(t))
    for k in nones:
        if k not in tensors or tensors[k] is not None:
            return None
    return data


def _arrived(route: _RecvRoute) -> dict[str, torch.Tensor | None]:
    """The received tensors start a new graph on this stage: fresh leaves (that collect a
    gradient) over the transfer's buffers, which the next step receives into again; a
    tuple's None places arrive as None (no data on the wire)."""
    _, names, bufs, floats, grads, nones, *_ = route
    out: dict[str, torch.Tensor | None] = {
        k: b.detach().requires_grad_(rg) if f else b.detach()
        for k, b, f, rg in zip(names, bufs, floats, grads, strict=True)
    }
    if nones:
        out.update(dict.fromkeys(nones))
    return out
