"""The Simulacron fixture lives in the package (``adaptive-lb loadtest --simulated`` uses it
too); re-exported here for the tests."""

from adaptive_lb.tools.peers.simulacron import *  # noqa: F403
from adaptive_lb.tools.peers.simulacron import __all__  # noqa: F401
