"""zb-auto: the fastest of named candidates under a memory limit, and `solve`.

`auto` runs the search (`search`, `AutoSearch`); `candidates` lists what it tries per
placement; `timeline` places actions for the searched builders (`greedy`, `heuristic`,
`v_heuristic`) and `refine` improves a finished program; `optimal` starts the exact solver
from zb-auto's schedule (`solve`, zb-opt).
"""
