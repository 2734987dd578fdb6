"""``python -m adaptive_lb.tools.sim demo|simulate ...``.

Imports :mod:`~adaptive_lb.tools.sim.cli` only.
"""

import sys

from adaptive_lb.tools.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
