"""Exit 0 when every NAME==VERSION argument is installed at exactly that version.

Used by the install scripts beside it to return in well under a second when a venv
already holds their pins: python cluster/pinned_ok.py sglang==0.5.23 torch==2.13.0+cpu
"""

import sys
from importlib.metadata import PackageNotFoundError, version

for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
