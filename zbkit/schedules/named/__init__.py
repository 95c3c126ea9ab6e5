"""The hand-written schedules' builders: `fixed` (GPipe, 1F1B, interleaved 1F1B, ZB-H1,
ZB-H2, ZB-V), `looped` (looped BFS, interleaved zero bubble), `v` (V-Half, V-Min) and
`dualpipe` (DualPipeV). Each returns per-rank programs; `zbkit.schedules.catalog` names them.
"""
