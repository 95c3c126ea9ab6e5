"""IPython magics over one `Cluster` per kernel.

    %load_ext zbkit
    %zb_start -n 4 [--backend gloo] [--timeout 60]
    %%zb [--rank 0,1] [--timeout 10]      <- the cell runs on those ranks (default: all)
    %%zb --out traces                     <- the ranks' values, a list, into `traces` here
    %zb_status
    %zb_stop

The cluster lives on the magics object IPython keeps for this kernel (no module
globals). The value of a cell's last expression is shown per rank; rich values (a
graphviz graph, a matplotlib figure, anything with ``_repr_html_``) render as themselves,
and a value that cannot be pickled shows as its display (``Cluster.exec(display=True)``).
With ``--out NAME`` nothing is shown: the values, one per rank in rank order, are stored in
the notebook's variable NAME, so a rank's result (a trace, a table) is used here as data.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from zbkit.launch._errors import quiet_interrupt
from zbkit.launch._procs import BACKENDS, check_args, check_timeout
from zbkit.launch._rich import RichResult, is_figure
from zbkit.launch.cluster import Cluster

_RICH_METHODS = ("_repr_mimebundle_", "_repr_html_", "_repr_svg_", "_repr_png_", "_repr_markdown_")


def _parse_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--rank takes comma-separated ints such as 0,1; got {text!r}") from None


def _no_arguments(name: str, line: str) -> None:
    if line.strip():
        raise UsageError(f"%{name} takes no arguments, got {line.strip()!r}")


def _is_rich(value: Any) -> bool:
    return (
        isinstance(value, RichResult)
        or is_figure(value)
        or any(callable(getattr(value, m, None)) for m in _RICH_METHODS)
    )


@magics_class
class ZbMagics(Magics):
    """%zb_start, %%zb, %zb_stop and %zb_status; holds this kernel's cluster."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cluster: Cluster | None = None

    def _running(self) -> Cluster:
        if self.cluster is None:
            raise UsageError("no cluster yet: start one with %zb_start -n 2")
        return self.cluster  # a stopped one says why when asked to run (a LaunchError)

    @magic_arguments()
    @argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    @argument("--backend", default="gloo", choices=BACKENDS, help="torch.distributed backend")
    @argument("--timeout", type=float, default=None, help="default seconds per cell")
    @line_magic
    def zb_start(self, line: str) -> None:
        """Start ranks that keep their state between %%zb cells (stops a previous cluster)."""
        args = parse_argstring(self.zb_start, line)
        try:  # before stopping the running cluster: a typo must not cost it
            check_args(args.nprocs, args.backend)
            check_timeout(args.timeout, "--timeout")
        except (TypeError, ValueError) as exc:
            raise UsageError(f"%zb_start: {exc}") from None
        if self.cluster is not None and not self.cluster.closed:
            self.cluster.close()
            print("stopped the previous cluster")
        self.cluster = None
        self.cluster = Cluster(args.nprocs, backend=args.backend, timeout=args.timeout)
        print(f"started {args.nprocs} ranks ({args.backend}); %%zb runs a cell on them")

    @magic_arguments()
    @argument("--rank", default=None, help="comma-separated ranks to run on (default: all)")
    @argument("--timeout", type=float, default=None, help="seconds before showing stacks")
    @argument("--out", default=None, help="store the ranks' values (a list) in this variable")
    @cell_magic
    def zb(self, line: str, cell: str) -> None:
        """Run the cell on the cluster's ranks; show each rank's last-expression value, or
        store them (a list in rank order) in the notebook's variable named by --out."""
        args = parse_argstring(self.zb, line)
        if args.out is not None and not args.out.isidentifier():
            raise UsageError(f"%%zb --out takes a variable name, got {args.out!r}")
        cluster = self._running()
        ranks = _parse_ranks(args.rank)
        try:  # a value kept as data must travel as itself, not as its display
            values = cluster.exec(cell, ranks=ranks, timeout=args.timeout, display=args.out is None)
        except KeyboardInterrupt as exc:  # this line alone, not the wait loop's frames
            quiet_interrupt(exc, "every rank was stopped; %zb_start to start again")
            raise
        except (TypeError, ValueError) as exc:  # bad --rank or --timeout: one line
            raise UsageError(f"%%zb: {exc}") from None
        if args.out is not None:
            assert self.shell is not None  # a cell magic runs in a shell
            self.shell.user_ns[args.out] = values
            return
        for rank, value in zip(ranks or range(cluster.nprocs), values, strict=True):
            if value is None:
                continue
            if _is_rich(value):
                print(f"[rank {rank}]")
                display(value)
            else:
                print(f"[rank {rank}] {value!r}")

    @line_magic
    def zb_stop(self, line: str) -> None:
        """Stop the cluster's ranks."""
        _no_arguments("zb_stop", line)
        if self.cluster is None:
            print("no cluster is running")
        elif self.cluster.closed:
            print(f"no cluster is running: {self.cluster!r}")
        else:
            self.cluster.close()
            print("stopped")
        self.cluster = None

    @line_magic
    def zb_status(self, line: str) -> None:
        """Show the ranks, their pids and whether they are alive."""
        _no_arguments("zb_status", line)
        print(self.cluster.status() if self.cluster is not None else "no cluster")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext zbkit.launch.magics`` (or ``%load_ext zbkit``): registers the magics."""
    ipython.register_magics(ZbMagics(ipython))


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext``: closes the kernel's cluster, if any, and removes the magics."""
    magics = ipython.magics_manager.registry.pop("ZbMagics", None)
    if magics is not None and magics.cluster is not None:
        magics.cluster.close()
    # IPython has no "unregister": drop our names from its tables.
    for kind, names in (("line", ("zb_start", "zb_stop", "zb_status")), ("cell", ("zb",))):
        for name in names:
            ipython.magics_manager.magics[kind].pop(name, None)
