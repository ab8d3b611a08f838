"""python -m tests.boxd_emulator: the command line of scripts/boxd-emulator."""

from .cli import main

raise SystemExit(main())
