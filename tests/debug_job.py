"""``torchrun --nproc-per-node 2 tests/debug_job.py``, as before: the job now ships with zbkit,
``zbkit.debug_demo`` (``torchrun --nproc-per-node 2 -m zbkit.debug_demo``), so notebook 08
runs it from an installed zbkit too. Read the job there."""

from __future__ import annotations

from zbkit.debug_demo import main

if __name__ == "__main__":
    main()
