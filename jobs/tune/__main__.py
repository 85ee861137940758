"""python -m jobs.tune: the same as `raygen tune` (jobs/tune/command.py)."""

import sys

from jobs.tune.command import main

sys.exit(main())
