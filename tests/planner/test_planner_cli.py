"""`zbkit schedule NAME --profile PATH`: the schedule's own output, then the planner's
prediction, every number printed equal to `planner.predict` on the same saved profile (the
oracle); each bad input refused with one line and exit 2. In this process through
`zbkit.cli.main`, and once as the command a user types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zbkit import planner
from zbkit.cli import main
from zbkit.schedules import Schedule

ROOT = Path(__file__).resolve().parents[2]


def _ranks(out: str) -> list[dict]:
    """The prediction's rows, read back: per rank its bytes (ints) and its milliseconds."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("predicted from")) + 1
    rows = []
    for line in lines[head + 1 :]:
        if not line.lstrip()[:1].isdigit():
            break
        words = line.split()
        at_step = words[2] == "optimizer"  # "optimizer step" or "compute"
        compute, *parts, ms = words[4:] if at_step else words[3:]
        rows.append(
            {
                "rank": int(words[0]),
                "peak_bytes": int(words[1].replace(",", "")),
                "at_step": at_step,
                "compute": int(compute.replace(",", "")),
                "breakdown": [int(p.replace(",", "")) for p in parts],
                "ms": float(ms),
            }
        )
    return rows


def _step_ms(out: str) -> float:
    line = next(x for x in out.splitlines() if x.startswith("step: "))
    return float(line.split()[1])


def _check_against(out: str, prediction: planner.Prediction) -> None:
    rows = _ranks(out)
    assert [r["rank"] for r in rows] == list(range(len(prediction.ranks)))
    for row, want in zip(rows, prediction.ranks, strict=True):
        assert row["peak_bytes"] == want.peak_bytes
        assert row["at_step"] == want.at_step
        assert row["breakdown"] == list(want.breakdown.values())
        assert row["compute"] == sum(want.breakdown.values())
        assert row["peak_bytes"] == max(row["compute"], row["peak_bytes"])
        assert row["ms"] == pytest.approx(want.seconds * 1e3, rel=1e-3)
    assert _step_ms(out) == pytest.approx(prediction.step_seconds * 1e3, rel=1e-3)
    spans = ", ".join(f"{s.start}-{s.stop - 1}" if len(s) > 1 else str(s.start)
                      for s in prediction.stages)  # fmt: skip
    assert f"stages' layers: {spans}; on ranks {prediction.schedule.stage_to_rank}" in out


@pytest.mark.parametrize(
    "name, pp, m, options",
    [
        ("1f1b", 2, 4, {}),
        ("zb-h1", 4, 8, {}),
        ("zb-v", 2, 4, {}),
        ("interleaved-1f1b", 2, 4, {"stages_per_rank": 2}),
        ("zb-auto", 2, 4, {"placement": "v"}),
    ],
)
def test_the_printed_prediction_is_predicts(saved, capsys, name, pp, m, options):
    argv = ["schedule", name, "--pp", str(pp), "-m", str(m), "--profile", str(saved)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Schedule({name!r}, pp={pp}")  # the schedule's own output first
    assert out.index("bubble rate") < out.index("predicted from")
    prediction = planner.predict(
        planner.Profile.load(saved), name, pp=pp, microbatches=m, **options
    )
    _check_against(out, prediction)


def test_a_loaded_schedule_is_predicted_as_loaded(saved, tmp_path, capsys):
    csv = tmp_path / "zb-h1.csv"
    assert main(["schedule", "zb-h1", "--pp", "2", "-m", "4", "--save", str(csv)]) == 0
    capsys.readouterr()
    assert main(["schedule", "--load", str(csv), "--profile", str(saved)]) == 0
    loaded = Schedule.load(csv)
    prediction = planner.predict(planner.Profile.load(saved), loaded, pp=2, microbatches=4)
    _check_against(capsys.readouterr().out, prediction)


def test_without_a_profile_nothing_is_predicted(capsys):
    assert main(["schedule", "zb-h1", "--pp", "2", "-m", "4"]) == 0
    assert "predicted from" not in capsys.readouterr().out


def test_help_names_the_option(capsys):
    with pytest.raises(SystemExit) as done:
        main(["schedule", "--help"])
    assert done.value.code == 0
    assert "--profile PATH" in capsys.readouterr().out


def _refused(capsys, argv: list[str]) -> tuple[str, str]:
    """Exit 2 and one line on stderr; returns (stdout, that line)."""
    assert main(argv) == 2
    got = capsys.readouterr()
    lines = got.err.strip().splitlines()
    assert len(lines) == 1, got.err
    assert lines[0].startswith("zbkit schedule: ")
    return got.out, lines[0]


def test_a_missing_file_is_refused(tmp_path, capsys):
    missing = tmp_path / "none.json"
    out, line = _refused(capsys, ["schedule", "1f1b", "--profile", str(missing)])
    assert line == f"zbkit schedule: --profile {missing}: No such file or directory"
    assert out == ""  # read before the schedule is printed
    out, line = _refused(capsys, ["schedule", "1f1b", "--profile", str(tmp_path)])
    assert line == f"zbkit schedule: --profile {tmp_path}: Is a directory"


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '"a string"', "{}", '{"layers": 3}', '{"layers": [{"name": "x"}]}'],
)
def test_a_file_that_is_not_a_profile_is_refused(tmp_path, capsys, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    out, line = _refused(capsys, ["schedule", "1f1b", "--profile", str(path)])
    assert line.startswith(
        f"zbkit schedule: --profile {path} is not a profile saved by planner.Profile.save ("
    )
    assert out == ""


def test_too_few_layers_for_the_stages_says_predicts_message(saved, capsys):
    # zb-v on 4 ranks has 8 stages, the profile 4 layers
    with pytest.raises(ValueError) as expected:
        planner.predict(planner.Profile.load(saved), "zb-v", pp=4, microbatches=8)
    out, line = _refused(capsys, ["schedule", "zb-v", "--pp", "4", "--profile", str(saved)])
    assert line == f"zbkit schedule: {expected.value}"
    assert out.startswith("Schedule('zb-v', pp=4") and "predicted from" not in out


def test_a_memory_limit_in_costs_units_is_refused(saved, capsys):
    argv = ["schedule", "zb-auto", "--memory-limit", "3", "--profile", str(saved)]
    out, line = _refused(capsys, argv)
    assert "--memory-limit" in line and out == ""


def test_a_refused_schedule_says_what_it_says_without_a_profile(saved, capsys):
    argv = ["schedule", "zb-v", "--placement", "linear"]
    assert main(argv) == 1
    plain = capsys.readouterr()
    assert main([*argv, "--profile", str(saved)]) == 1
    assert capsys.readouterr() == plain


def test_the_command_a_user_types(saved):
    name, pp, m = "zb-h1", 2, 4
    done = subprocess.run(
        [sys.executable, "-m", "zbkit", "schedule", name, "--pp", str(pp), "-m", str(m),
         "--profile", str(saved)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    prediction = planner.predict(planner.Profile.load(saved), name, pp=pp, microbatches=m)
    _check_against(done.stdout, prediction)
