"""One palette for every drawing: F, I, W mean the same colour on graphs and schedules."""

from __future__ import annotations

from zbkit.schedules import KINDS

# Colours follow the zero-bubble paper's figures: forward blue, input-grad (their "B") teal,
# weight-grad green; our unsplit "B" (= I then W) is a purple between them.
KIND_COLORS = {
    "F": "#7fa7d9",
    "I": "#4fb3a9",
    "W": "#8cc063",
    "B": "#a88bc9",
}
OTHER_KIND_COLOR = "#c8c8c8"  # a kind added to the table without a colour of its own
KIND_NAMES = {letter: kind.name for letter, kind in KINDS.items()}  # the table's words


# A rank's last chunk (ZB-V's stages p..2p-1, on the way back up): the same hues, dark and
# saturated. Picked by hand, not by darkening: scaled towards black, teal, green and blue all
# turn the same murky grey-green. Every dark pair differs by a CIELAB distance of 35 or more,
# and each dark colour from its light one by 29 or more; white text reads on all of them.
KIND_DARK_COLORS = {
    "F": "#1c4f99",
    "I": "#00666e",
    "W": "#3e730f",
    "B": "#7a2e8e",
}
OTHER_KIND_DARK_COLOR = "#6e6e6e"


def kind_color(letter: str) -> str:
    return KIND_COLORS.get(letter, OTHER_KIND_COLOR)


def chunk_color(letter: str, chunk: int, num_chunks: int) -> str:
    """The kind's colour for chunk 0, its dark colour for the last chunk, in between for the
    chunks between (interleaved schedules with more than two stages per rank)."""
    light = kind_color(letter)
    if num_chunks <= 1 or chunk == 0:
        return light
    dark = KIND_DARK_COLORS.get(letter, OTHER_KIND_DARK_COLOR)
    f = chunk / (num_chunks - 1)
    # plain hex arithmetic: draw_graph uses this module without matplotlib installed
    rgb = [int(light[i : i + 2], 16) * (1 - f) + int(dark[i : i + 2], 16) * f for i in (1, 3, 5)]
    return "#" + "".join(f"{round(v):02x}" for v in rgb)


IDLE_COLOR = "#eeeeee"  # bubbles: a rank waiting inside its span (hatched)
EDGE_COLOR = "#f3f3f3"  # before a rank's first action / after its last: not a bubble
COMM_COLOR = "#555555"  # a rank waiting on a receive of its communication plan
LIMIT_COLOR = "#d62728"  # memory limit line
SPLIT_COLOR = "#d62728"  # split points (intermediates) on the graph
PARAM_FILL = "#fff4c2"
INPUT_FILL = "#cfe8ff"
OUTPUT_FILL = "#ffd9d9"
DIM_FILL = "#f7f7f7"
DIM_FONT = "#aaaaaa"

# Light fills for ParamGroup clusters (cycled when there are more groups than colours).
GROUP_COLORS = (
    "#fde2e4",
    "#e2ece9",
    "#dfe7fd",
    "#fff1e6",
    "#e8dff5",
    "#fce1e4",
    "#ddedea",
    "#f0efeb",
)


def group_color(index: int) -> str:
    return GROUP_COLORS[index % len(GROUP_COLORS)]
