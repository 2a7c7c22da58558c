"""`python -m ppmq.bench`: the same as `ppmq bench`."""

import sys

from ppmq.bench.cli import main

sys.exit(main())
