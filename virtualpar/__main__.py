"""``python -m virtualpar``: the same as the ``virtualpar`` command."""

import sys

from .cli import main

sys.exit(main())
