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


def kind_color(letter: str) -> str:
    return KIND_COLORS.get(letter, OTHER_KIND_COLOR)


IDLE_COLOR = "#eeeeee"  # bubbles: a rank waiting inside its span (hatched)
EDGE_COLOR = "#f3f3f3"  # before a rank's first action / after its last: not a bubble
COMM_COLOR = "#555555"  # a rank waiting on a receive of its communication plan
LIMIT_COLOR = "#d62728"  # memory limit line
SPLIT_COLOR = "#d62728"  # split points (intermediates) on the graph
CLOSURE_FILL = "#e4e4e4"  # nodes the input-gradient pass runs through
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
