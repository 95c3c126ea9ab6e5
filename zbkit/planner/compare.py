"""`compare(prediction, measured)`: predicted against measured, per rank, in bytes and seconds.

A `Comparison` prints as a table (and renders as one in a notebook): each rank's predicted
and measured peak bytes and step seconds with their ratio, and in words where they differ
by more than the tolerance and what the prediction's breakdown says was held at its peak.
`plot()` draws each rank's predicted memory over the step with the measured peak marked.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from zbkit.planner.measure import Measured
from zbkit.planner.predict import Prediction

__all__ = ["Comparison", "compare"]


@dataclass(frozen=True)
class Comparison:
    prediction: Prediction
    measured: Measured
    bytes_tolerance: float = 0.05  # a ratio this far from 1 is said in words
    seconds_tolerance: float = 0.15

    @property
    def peak_ratios(self) -> list[float]:
        """Per rank: predicted peak bytes / measured."""
        return [
            p.peak_bytes / m.peak_bytes if m.peak_bytes else float("inf")
            for p, m in zip(self.prediction.ranks, self.measured.ranks, strict=True)
        ]

    @property
    def seconds_ratio(self) -> float:
        """The step: predicted seconds / measured."""
        return self.prediction.step_seconds / self.measured.step_seconds

    def rows(self) -> list[list[str]]:
        out = []
        for r, (p, m, ratio) in enumerate(
            zip(self.prediction.ranks, self.measured.ranks, self.peak_ratios, strict=True)
        ):
            times = [_ms(p.seconds), _ms(m.seconds), f"{p.seconds / m.seconds:.3f}"]
            out.append([str(r), _mib(p.peak_bytes), _mib(m.peak_bytes), f"{ratio:.3f}", *times])
        return out

    def notes(self) -> list[str]:
        """Where prediction and measurement differ beyond the tolerances, and what the
        prediction held at its peak there."""
        out = []
        for r, (p, ratio) in enumerate(zip(self.prediction.ranks, self.peak_ratios, strict=True)):
            if abs(ratio - 1) > self.bytes_tolerance:
                more = "more" if ratio > 1 else "less"
                when = "the optimizer's step" if p.at_step else "the compute"
                held = ", ".join(f"{k} {_mib(v)}" for k, v in p.breakdown.items() if v)
                out.append(
                    f"rank {r}: predicted {abs(ratio - 1):.0%} {more} than measured; its "
                    f"predicted peak is at {when}, holding {held} MiB"
                )
        ratio = self.seconds_ratio
        if abs(ratio - 1) > self.seconds_tolerance:
            why = (
                "a prediction without the wire's hop and the runtime's own per-action cost "
                "(predict's hop and overhead) is short by them"
                if ratio < 1
                else "the profile's actions took longer than the run's (a machine busier "
                "while profiling, or fewer repeats than its noise needs)"
            )
            out.append(f"step: predicted {ratio:.2f}x the measured time; {why}")
        return out

    def __str__(self) -> str:
        head = ["rank", "peak MiB", "measured", "ratio", "step ms", "measured", "ratio"]
        lines = [
            f"{self.prediction.schedule.name}, pp={self.prediction.schedule.pp}, "
            f"m={self.prediction.schedule.microbatches}: predicted against measured",
            "  ".join(f"{h:>9}" for h in head),
        ]
        lines += ["  ".join(f"{c:>9}" for c in row) for row in self.rows()]
        lines += self.notes() or ["within the tolerances on every rank"]
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        head = ["rank", "peak MiB", "measured MiB", "ratio", "step ms", "measured ms", "ratio"]
        cells = "".join(f"<th>{h}</th>" for h in head)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self.rows()
        )
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes())
        title = html.escape(str(self).splitlines()[0])
        return (
            f"<div class='zb-compare'><p>{title}</p><table><tr>{cells}</tr>{body}</table>"
            f"<ul>{notes or '<li>within the tolerances on every rank</li>'}</ul></div>"
        )

    def plot(self):
        """Each rank's predicted memory over the step (the simulator's steps in bytes, plus
        what never leaves), the measured peak a dashed line: a matplotlib Figure."""
        # lazily: matplotlib is the notebook extra; the numbers above need none of it
        import matplotlib.pyplot as plt

        sim, ranks = self.prediction.simulation, self.prediction.ranks
        # one time axis for every rank, so a learner reads across ranks at the same moment
        fig, axes = plt.subplots(
            len(ranks), 1, figsize=(8, 1.8 * len(ranks)), sharex=True, squeeze=False
        )
        for r, ax in enumerate(axes[:, 0]):
            base = ranks[r].parameters + ranks[r].optimizer
            steps = sim.memory[r]
            ax.step([t * 1e3 for t, _ in steps], [(base + v) / 2**20 for _, v in steps],
                    where="post", label="predicted (without gradients)")  # fmt: skip
            ax.axhline(ranks[r].peak_bytes / 2**20, color="C0", lw=0.8, label="predicted peak")
            measured = self.measured.ranks[r].peak_bytes / 2**20
            ax.axhline(measured, color="C3", ls="--", label="measured peak")
            ax.set_ylabel(f"rank {r}\nMiB")
        # above the first rank, in a row: inside, it hid the curve it names
        axes[0, 0].legend(loc="lower left", bbox_to_anchor=(0, 1.02), ncol=3, fontsize=8,
                          frameon=False, borderaxespad=0)  # fmt: skip
        axes[-1, 0].set_xlabel("ms into the step")
        fig.tight_layout()
        plt.close(fig)
        return fig


def compare(prediction: Prediction, measured: Measured, **tolerances: float) -> Comparison:
    """`prediction` beside `measured` (the same schedule, ranks and stages)."""
    if not isinstance(prediction, Prediction) or not isinstance(measured, Measured):
        raise TypeError("compare takes a planner.predict(...) result and a planner.measure(...)")
    if len(prediction.ranks) != len(measured.ranks):
        raise ValueError(
            f"compare: the prediction has {len(prediction.ranks)} ranks, the measurement "
            f"{len(measured.ranks)}"
        )
    if prediction.schedule.name != measured.schedule:
        raise ValueError(
            f"compare: predicted {prediction.schedule.name!r} but measured {measured.schedule!r}"
        )
    ran = measured.program
    if (ran.program, ran.stage_to_rank) != (prediction.schedule.program,
                                            prediction.schedule.stage_to_rank):  # fmt: skip
        raise ValueError(
            f"compare: the program measured is not the one predicted ({measured.schedule!r} "
            "searched or built anew): measure the prediction's own, measure(..., "
            "prediction.schedule, ...)"
        )
    if list(prediction.stages) != list(measured.stages):
        raise ValueError(
            f"compare: predicted stages {prediction.stages} but measured {measured.stages}: "
            "measure with stages=prediction.stages"
        )
    if prediction.profile.device.split(":")[0] != measured.device.split(":")[0]:
        raise ValueError(
            f"compare: the profile was measured on {prediction.profile.device}, the run on "
            f"{measured.device}: profile on the device you run on"
        )
    return Comparison(prediction, measured, **tolerances)


def _mib(value: float) -> str:
    return f"{value / 2**20:.2f}"


def _ms(value: float) -> str:
    return f"{value * 1e3:.1f}"
