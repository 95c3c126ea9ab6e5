"""The Zero Bubble paper's published numbers (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024), quoted once so that the tests, the notebooks and the benchmarks compare against
the same figures.

`TABLE6`: the times the paper profiled per microbatch on its GPT-style models, in ms: F, B (our
I, the input gradient), W and one hop's communication, per model and number of microbatches m.
`TABLE5`: the bubble rates the paper computes from those times for 1F1B, ZB-H1, ZB-H2, ZB-1p and
ZB-2p (ZB-1p and ZB-2p are its automatic schedules under p and 2p activations of memory).
`mem_weight_ratio` is its M_W / M_B for a model: 32h / (34h + 5as), sequence length s = 1024.
"""

from __future__ import annotations

__all__ = ["TABLE5", "TABLE6", "mem_weight_ratio"]

# model: (p, hidden h, heads a, {m: (F, I, W, comm) in ms})
TABLE6: dict[str, tuple[int, int, int, dict[int, tuple[float, float, float, float]]]] = {
    "1.5B": (8, 2304, 24, {24: (18.522, 18.086, 9.337, 0.601), 32: (18.513, 18.086, 9.331, 0.626),
                           64: (18.546, 18.097, 9.321, 0.762)}),
    "6.2B": (8, 4096, 32, {24: (29.718, 29.444, 19.927, 0.527), 32: (29.802, 29.428, 19.530, 0.577),
                           64: (29.935, 29.621, 19.388, 0.535)}),
    "14.6B": (16, 5120, 40, {48: (11.347, 11.248, 8.132, 0.377), 64: (11.307, 11.254, 8.101, 0.379),
                             128: (11.325, 11.308, 8.109, 0.378)}),
    "28.3B": (32, 6144, 48, {96: (10.419, 10.207, 7.715, 0.408),
                             128: (10.408, 10.204, 7.703, 0.408),
                             256: (10.402, 10.248, 7.698, 0.460)}),
}  # fmt: skip

# (model, m): bubble rates of 1F1B, ZB-H1, ZB-H2, ZB-1p, ZB-2p, as printed (4 digits)
TABLE5: dict[tuple[str, int], tuple[float, float, float, float, float]] = {
    ("1.5B", 24): (0.2431, 0.1585, 0.1083, 0.1585, 0.0433),
    ("1.5B", 32): (0.1985, 0.1242, 0.0837, 0.1242, 0.0039),
    ("1.5B", 64): (0.1240, 0.0674, 0.0444, 0.0674, 0.0026),
    ("6.2B", 24): (0.2347, 0.1323, 0.0698, 0.1323, 0.0029),
    ("6.2B", 32): (0.1898, 0.1045, 0.0559, 0.1045, 0.0022),
    ("6.2B", 64): (0.1091, 0.0554, 0.0294, 0.0554, 0.0010),
    ("14.6B", 48): (0.2552, 0.1397, 0.0672, 0.1397, 0.0066),
    ("14.6B", 64): (0.2082, 0.1088, 0.0516, 0.1088, 0.0054),
    ("14.6B", 128): (0.1251, 0.0576, 0.0266, 0.0576, 0.0028),
    ("28.3B", 96): (0.2646, 0.1421, 0.0641, 0.1421, 0.0038),
    ("28.3B", 128): (0.2168, 0.1106, 0.0490, 0.1106, 0.0029),
    ("28.3B", 256): (0.1352, 0.0594, 0.0257, 0.0594, 0.0018),
}


def mem_weight_ratio(model: str) -> float:
    """The paper's M_W / M_B for `model` (a TABLE6 key): 32h / (34h + 5as), s = 1024."""
    _, h, a, _ = TABLE6[model]
    return 32 * h / (34 * h + 5 * a * 1024)
