"""A scenario checked against the registries before any work starts, and the
audit's ``auto`` portfolio resolved from what the scenario allows.
"""
