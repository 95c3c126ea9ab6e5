import psutil
import pytest


@pytest.fixture
def live_children():
    """A callable listing this test process's descendants that still exist (zombies too)."""

    def children(pid=None):
        proc = psutil.Process(pid) if pid else psutil.Process()
        return [p for p in proc.children(recursive=True) if p.is_running()]

    return children
