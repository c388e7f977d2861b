"""The piecewise backend: split, plan, build and dispatch pieces (imports torch)."""
