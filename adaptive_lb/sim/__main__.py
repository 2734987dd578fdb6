"""``python -m adaptive_lb.sim demo|simulate ...``."""

import sys

from adaptive_lb.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
