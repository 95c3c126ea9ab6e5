"""The package's behaviour, read through its public API, is what it was when recorded.

`benchmarks/schedules_fingerprint.py` reads every named schedule's program, simulation and
throughput over a grid, zb-auto's programs and explanations under several limits and both
placements, the bounds and `solve`'s answers. A change that moves code must leave the digest
as it is; a change that means to change behaviour updates it and says why in its commit.
"""

import importlib.util
from pathlib import Path

RECORDED = "6fdd2234ad97c470371ca5942ada4788414ef881f4d9e99b35ff018963d869c8"
SCRIPT = Path(__file__).parents[2] / "benchmarks" / "schedules_fingerprint.py"


def _load():
    spec = importlib.util.spec_from_file_location("schedules_fingerprint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_public_behaviour_is_the_recorded_one():
    fp = _load()
    values = fp.fingerprint()
    assert len(values["named"]) == 264 and len(values["searched"]) == 192
    assert fp.digest(values) == RECORDED, (
        "zbkit.schedules behaves differently: run `python benchmarks/schedules_fingerprint.py "
        "--out new.json` here and on the last commit and diff the two files"
    )
