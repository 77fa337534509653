"""``python -m simfleet``: the command-line tool (see ``simfleet.cli``)."""

import sys

from simfleet.cli import main

sys.exit(main())
