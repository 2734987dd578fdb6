"""``python -m adaptive_lb`` is the ``adaptive-lb`` command."""

import sys

from adaptive_lb.tools.cli import main

sys.exit(main())
