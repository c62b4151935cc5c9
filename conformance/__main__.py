"""``python -m conformance`` = ``whitney-conformance``."""

import sys

from .cli import main

sys.exit(main())
