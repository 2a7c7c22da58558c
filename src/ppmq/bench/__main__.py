"""`python -m ppmq.bench`: the same as `ppmq bench`."""

import sys

from .cli import main

sys.exit(main())
