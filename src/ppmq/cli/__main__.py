"""`python -m ppmq.cli`: the `ppmq` command, as the installed script runs it."""

import sys

from ppmq.cli.main import main

sys.exit(main())
