"""``python -m tierlog``: the command line."""

import sys

from tierlog.cli import main

sys.exit(main())
