"""``python -m airstream``: the ``airstream`` command, for environments without its script."""

import sys

from airstream.cli import main

sys.exit(main())
