"""``python -m fixedhead ...``: the same command as the ``fixedhead`` script."""

import sys

from .cli import main

sys.exit(main())
