"""``fedsim compare``: a grid of scenarios run one after the other, and their table."""
