"""``python -m adaptive_lb`` is the ``adaptive-lb`` command."""

import sys

from adaptive_lb.cli import main

sys.exit(main())
