"""`SplitBackwardStepper`: run F, then I, then W by hand and watch the `.grad`s fill in.

The point to see: after I the inputs have their gradient and no parameter has one; after W
every parameter's `.grad` equals what one plain `backward()` gives (the oracle column).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any, cast

import ipywidgets as w
import torch
from IPython.display import display

from zbkit.splitgrad import analyze, stage_backward_input, stage_backward_weight
from zbkit.viz import draw_graph
from zbkit.viz.graph import Phase
from zbkit.widgets._common import Offline, as_tensors, table_html

_PHASES = ("F", "I", "W")
_BUTTON_TEXT = {"F": "F: forward", "I": "I: input grad", "W": "W: weight grad", "reset": "reset"}
_NEXT = {"ready": "F", "F": "I", "I": "W", "W": "F"}  # which button is live after each phase


def _norm(t: torch.Tensor | None) -> str:
    return "-" if t is None else f"{t.norm().item():.4g}"


class SplitBackwardStepper(Offline, w.VBox):
    """Buttons F -> I -> W (and reset) on `module(*inputs)`; graph and `.grad` table update.

    A non-scalar output gets gradient ones (as if its sum were the loss). Every parameter's
    `.grad` is cleared when the stepper is made (the names it cleared: `cleared`), so the
    table shows only what its own passes compute. Attributes for code:
    `buttons` (dict of the four buttons), `phase` ("ready", "F", "I" or "W"), `graph` (the last
    drawing), `table` (an HTML widget), `input_grads` (after I).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        inputs: torch.Tensor | Sequence[torch.Tensor],
        output_grads: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        self.module = module
        self.inputs = as_tensors(inputs, "inputs")
        self.output_grads = output_grads
        self.weights = [p for p in module.parameters() if p.requires_grad]
        self.names = {id(p): n for n, p in module.named_parameters()}  # lookup only
        # A .grad left by earlier code (a backward of another loss, a split backward run by
        # hand) is not this stepper's work: the table would set it against this stepper's
        # oracle and say NO for every parameter. Start clean, as F does, and say so.
        self.cleared = [self.names.get(id(p), "?") for p in self.weights if p.grad is not None]
        for p in self.weights:
            p.grad = None
        self.ref_weights, self.ref_inputs = self._plain_autograd()
        self.phase = "ready"
        self.graph: Any = None
        self.analysis: Any = None
        self.input_grads: list[torch.Tensor | None] = []
        self.refused: str | None = None  # why the last second W was refused

        self.buttons = {k: w.Button(description=t) for k, t in _BUTTON_TEXT.items()}
        for kind, button in self.buttons.items():
            button.on_click(lambda _, kind=kind: self.step(kind))
            button.add_class(f"zb-step-{kind}")
        self.status = w.HTML()
        self.out = w.Output()  # the graph, and any error
        self.table = w.HTML()
        super().__init__(
            [
                w.HTML("<b>Split backward, step by step</b>"),
                w.HBox(list(self.buttons.values())),
                self.status,
                self.table,
                self.out,
            ]
        )
        self.add_class("zb-stepper")
        self._refresh()

    def _offline_what(self) -> str:
        return f"F, I, W by hand on {type(self.module).__name__}"

    # -------------------------------------------------------------- the three passes
    def _forward(self) -> list[torch.Tensor]:
        # fresh leaf copies: each F starts a new graph, and the caller's tensors stay untouched
        self.xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in self.inputs]
        out = self.module(*self.xs)
        outputs = as_tensors(out.values() if isinstance(out, dict) else out, "module output")
        grads = self.output_grads
        if grads is None and any(o.numel() != 1 for o in outputs):
            grads = [torch.ones_like(o) for o in outputs]  # gradient of sum(outputs)
        self.grads = grads
        return outputs

    def _plain_autograd(self) -> tuple[list[Any], list[Any]]:
        """The oracle: (weight grads, input grads) of one plain backward; no `.grad` changes."""
        outputs = self._forward()
        grads = self.grads if self.grads is not None else [None] * len(outputs)
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if o.requires_grad]
        xs = [x for x in self.xs if x.requires_grad]
        found = torch.autograd.grad(
            [o for o, _ in pairs], self.weights + xs, [g for _, g in pairs], allow_unused=True
        )
        by_input = iter(found[len(self.weights) :])
        inputs = [next(by_input) if x.requires_grad else None for x in self.xs]
        return list(found[: len(self.weights)]), inputs

    def step(self, kind: str) -> None:
        """Press a button from code: "F", "I", "W" or "reset"."""
        # refused before the Output context: inside IPython, Output shows an exception and
        # swallows it, and the caller would never hear of it
        if kind not in _BUTTON_TEXT:
            raise ValueError(f"step({kind!r}): use one of {', '.join(_BUTTON_TEXT)}")
        second_w = kind == "W" and self.phase == "W"  # the library refuses it; the widget says why
        if not second_w and kind != "reset" and kind != _NEXT[self.phase]:
            raise RuntimeError(f"step {kind} now is out of order: next is {_NEXT[self.phase]}")
        with self.out:
            self.out.clear_output(wait=True)
            if second_w:
                self._second_weight_pass()
                return
            if kind in ("reset", "F"):
                for p in self.weights:
                    p.grad = None  # start from empty .grad, so the table shows one step's work
                self.input_grads = []
                self.cleared = []  # said once, before the first F
            if kind == "F":
                self.outputs = self._forward()
                self.analysis = analyze(self.outputs, self.xs, self.module)
            elif kind == "I":
                self.result = stage_backward_input(self.outputs, self.grads, self.xs, self.weights)
                self.input_grads = self.result.input_grads
            elif kind == "W":
                stage_backward_weight(self.weights, self.result.param_groups)
            self.phase = "ready" if kind == "reset" else kind
            self._refresh()

    def _second_weight_pass(self) -> None:
        """W again on the same microbatch: what I left for W is consumed once, so
        `stage_backward_weight` refuses (adding the weight gradients twice would be wrong).
        Its own message goes into the status line; the `.grad`s stay as they were."""
        try:
            stage_backward_weight(self.weights, self.result.param_groups)
        except RuntimeError as err:
            self.refused = str(err)
            self.status.value = (
                "<p style='color:#b00'><b>W refused</b>: "
                f"{html.escape(self.refused)}. Press F to start the next microbatch.</p>"
            )
        else:  # should not happen: the table then shows the doubled .grads
            self.refused = None
            self._refresh()
            return
        if self.graph is not None:
            display(self.graph)  # the output was cleared for this step: keep the graph

    # -------------------------------------------------------------- drawing
    def _refresh(self) -> None:
        live = _NEXT[self.phase]
        for kind in _PHASES:
            # after W, W stays pressable: a second press shows why it is refused
            again = kind == "W" and self.phase == "W"
            self.buttons[kind].disabled = kind != live and not again
            self.buttons[kind].button_style = "primary" if kind == live else ""
        said = {
            "ready": "Press F to run the forward and build the autograd graph.",
            "F": "Forward done: the graph exists, no gradient yet. Next: I.",
            "I": "I done: the inputs have gradients; no parameter's .grad changed. Next: W.",
            "W": "W done: every .grad is filled and equals plain autograd's. Press W again "
            "to see why a second W is refused, or F for the next microbatch.",
        }[self.phase]
        if self.cleared:
            said += (
                f" ({len(self.cleared)} parameters had a .grad from earlier code, such as "
                f"{self.cleared[0]}: cleared, so the table shows only the stepper's work.)"
            )
        self.status.value = f"<p>phase <b>{self.phase}</b>: {html.escape(said)}</p>"
        self.table.value = self._table()
        if self.analysis is not None:
            phase = cast(Phase, self.phase) if self.phase in _PHASES else None
            self.graph = draw_graph(self.analysis, highlight=phase)
            display(self.graph)

    def _table(self) -> str:
        rows = []
        for k, x in enumerate(self.inputs):
            got = self.input_grads[k] if k < len(self.input_grads) else None
            rows.append((f"input[{k}]", x, got, self.ref_inputs[k]))
        for p, ref in zip(self.weights, self.ref_weights, strict=True):
            rows.append((self.names.get(id(p), "?"), p, p.grad, ref))
        body = []
        for name, t, got, ref in rows:
            if got is None or ref is None:
                same = "-"
            else:
                same = "yes" if torch.allclose(got, ref, rtol=1e-5, atol=1e-6) else "NO"
            filled = "filled" if got is not None else "empty"
            body.append([name, str(tuple(t.shape)), filled, _norm(got), same])
        return table_html(["tensor", "shape", ".grad", "norm", "= plain autograd"], body)
