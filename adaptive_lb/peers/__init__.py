"""Real CQL peers to try the policy against: Simulacron (a simulated cluster started from
Maven Central) and a closed-loop load generator. Used by ``adaptive-lb loadtest`` and by the
integration tests."""
