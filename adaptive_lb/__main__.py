"""``python -m adaptive_lb`` is the ``adaptive-lb`` command.

Imports :mod:`adaptive_lb.tools.cli` only: the one module of the library that names a tool.
"""

import sys

from adaptive_lb.tools.cli import main

sys.exit(main())
