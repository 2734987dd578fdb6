"""Simulation support: clusters made of the driver's real objects, without a network."""
