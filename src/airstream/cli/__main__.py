"""``python -m airstream.cli``: the ``airstream`` command."""

import sys

from airstream.cli import main

sys.exit(main())
