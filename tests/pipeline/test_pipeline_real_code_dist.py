"""Real users' code across two gloo ranks: a None in a stage's tuple on the wire, torch's
several-input step, and ranks built with different schedules. One launch checks them all.
"""

from __future__ import annotations

import cloudpickle
import pytest
import real_code_models
import real_code_ranks

from zbkit.launch import launch

# the ranks cannot import test helper modules: ship them by value
cloudpickle.register_pickle_by_value(real_code_models)
cloudpickle.register_pickle_by_value(real_code_ranks)

pytestmark = pytest.mark.multiprocess


def test_real_code_across_two_ranks() -> None:
    out = launch(real_code_ranks.check_real_code, nprocs=2, timeout=300)
    rows = {(r["case"], r["rank"]): r for rank in out for r in rank}
    for case in ("None in the middle", "trailing None", "several inputs"):
        for rank in (0, 1):
            row = rows[case, rank]
            assert "error" not in row, row
            assert row["err"] < 1e-5, row
    # the None crossed the wire as None, once per microbatch of both steps
    assert rows["None in the middle", 1]["seen"] == [True] * 4
    for rank in (0, 1):
        row = rows["different schedules", rank]
        text = row["outcome"]
        # a ValueError from the first step's handshake, not a CommTimeout after WAIT seconds
        assert text.startswith("ValueError"), row
        assert "built with different schedules" in text, text
        assert "rank 0 run 'zb-h1' pp=2 microbatches=4" in text, text
        assert "rank 1 run 'zb-h1' pp=2 microbatches=2" in text, text
