"""python -m tests.daytona_emulator: the same as scripts/daytona-emulator."""

import sys

from .cli import main

sys.exit(main())
