"""The load generator lives in the package; re-exported here for the tests."""

from adaptive_lb.tools.peers.load import LoadResult, closed_loop

__all__ = ["LoadResult", "closed_loop"]
