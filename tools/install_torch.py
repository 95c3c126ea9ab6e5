"""Install torch into the Python that runs this script, from PyTorch's CPU wheel index when it
answers, else from pip's default index; say which on one line.

    python tools/install_torch.py torch==2.13.0            # what `make setup` runs
    python tools/install_torch.py --dry-run torch==2.13.0  # print the choice and the pip command

On Linux a bare `pip install torch` from PyPI is the multi-GB CUDA build; the CPU index serves
the same version as `2.13.0+cpu`. Where that index cannot be reached (a mirror-only network), pip's
default index is used: whatever `pip config list` points at, which may serve a CPU build itself.

ZBKIT_TORCH_INDEX overrides the CPU index's URL (a CUDA index such as .../whl/cu126, or a local
mirror); set to an empty string it skips the probe and uses the default index.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 10.0  # one GET of a small page; a closed port or an unknown host fails at once


def index_url() -> str:
    return os.environ.get("ZBKIT_TORCH_INDEX", CPU_INDEX).rstrip("/")


def serves(index: str, requirement: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None if `index` (a PEP 503 simple index) lists a wheel for `requirement`, else why not."""
    pinned = re.fullmatch(r"torch==([\w.]+)", requirement.strip())
    try:
        with urllib.request.urlopen(f"{index}/torch/", timeout=timeout) as page:
            listing = page.read().decode("utf-8", "replace")
    except (OSError, ValueError) as e:  # URLError, a refused connection, a timeout, a bad URL
        return f"unreachable: {getattr(e, 'reason', e)}"
    if pinned and f"torch-{pinned.group(1)}" not in listing:
        return f"lists no torch {pinned.group(1)}"
    if not pinned and "torch-" not in listing:
        return "lists no torch wheel"
    return None


def pip_command(requirement: str, index: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "install", requirement]  # no -q: pip shows its progress
    # --index-url, as PyTorch's install instructions give it: that index also serves torch's
    # dependencies, and no other index's build of torch can be picked instead
    return cmd + ["--index-url", index] if index else cmd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requirement", help="what to install, e.g. torch==2.13.0")
    parser.add_argument("--dry-run", action="store_true", help="print the pip command only")
    args = parser.parse_args(argv)

    index = index_url()
    why_not = serves(index, args.requirement) if index else None
    if index and why_not is None:
        print(f"install_torch: {args.requirement} from PyTorch's wheel index {index}", flush=True)
        cmd = pip_command(args.requirement, index)
    else:
        reason = f"{index} {why_not}" if index else "ZBKIT_TORCH_INDEX is empty"
        print(
            f"install_torch: {reason}; {args.requirement} from pip's default index "
            "(`pip config list` names it; from PyPI, Linux gets the CUDA build)",
            flush=True,
        )
        cmd = pip_command(args.requirement, None)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
