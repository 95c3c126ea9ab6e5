"""A matplotlib Figure that shows itself in Jupyter without pyplot, and renders reproducibly."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import matplotlib
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

# Fixed salt and no date: two renders of the same drawing give byte-identical SVG, which lets
# notebooks store outputs and nbval compare them.
_SVG_RC: dict[RcKeyType, Any] = {"svg.hashsalt": "zbkit", "svg.fonttype": "path"}
_SVG_METADATA = {"Date": None, "Creator": "zbkit"}


class ZbFigure(Figure):
    """`matplotlib.figure.Figure` with a PNG repr, so a bare figure displays in any kernel.

    Created directly (not through pyplot): nothing is registered in pyplot's global figure list,
    so drawing in a loop leaks nothing and `plt.show()` is never needed.
    """

    def to_png(self, dpi: float = 100, compress_level: int = 6) -> bytes:
        """PNG bytes; widgets that redraw often pass compress_level=1 (faster, a bit larger)."""
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=dpi, pil_kwargs={"compress_level": compress_level})
        return buf.getvalue()

    def to_svg(self) -> str:
        buf = io.StringIO()
        with matplotlib.rc_context(_SVG_RC):
            self.savefig(buf, format="svg", metadata=_SVG_METADATA)
        return buf.getvalue()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        width, height = self.get_size_inches()
        text = f"<{type(self).__name__} {width:.0f}x{height:.0f} in: {self._zb_summary}>"
        return {"image/png": self.to_png(), "text/plain": text}

    _zb_summary = "zbkit drawing"  # set by the plotting functions: what the figure shows

    def __repr__(self) -> str:  # cheap: no rendering
        return f"<{type(self).__name__}: {self._zb_summary}>"


DPI = 100  # what the plots are drawn at; widgets ask `to_png` for what they display


def check_ranks(ranks: list[int] | None, num_ranks: int) -> list[int]:
    """The ranks a plot shows: all of them by default, else the ones asked for (checked)."""
    if ranks is None:
        return list(range(num_ranks))
    bad = [r for r in ranks if not 0 <= r < num_ranks]
    if bad:
        raise ValueError(f"ranks {bad} are not in the run, which has ranks 0..{num_ranks - 1}")
    return list(ranks)
