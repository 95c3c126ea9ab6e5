"""`python -m zbkit`: the `zbkit` command, for when the script is not on PATH."""

import sys

from zbkit.cli import main

sys.exit(main())
