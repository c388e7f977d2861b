"""A constant the matrix model's pass imports from another module."""

PASS_LIMIT = 1
