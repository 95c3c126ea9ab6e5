"""What the planner's command-line tests share: one small profile, saved as JSON."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from zbkit import planner


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A profile of 4 small Linear layers, saved as JSON."""
    torch.manual_seed(0)
    layers = [nn.Linear(16, 16) for _ in range(4)]
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    planner.profile(layers, torch.randn(4, 16), repeats=1).save(path)
    return path
