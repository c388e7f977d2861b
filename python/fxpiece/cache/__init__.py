"""The compile cache on disk: layout, keys, index, artifacts, leases,
explain-a-miss and the admin verbs. Nothing here imports torch, so the
``fxpiece cache`` commands start in milliseconds."""
