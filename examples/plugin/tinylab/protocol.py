"""What tinylab's strategy and its client routine agree on (neither imports the other)."""

SMOOTHING = "tinylab-smoothing"
"""Train-config key: the label-smoothing weight the strategy sends each round."""
