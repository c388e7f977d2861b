"""Programs the tests run in fresh interpreters (``python -m programs.<name>``
with ``tests/`` on ``PYTHONPATH``, see :func:`programs.run.run_program`), and
the helpers they share with the tests. Real modules: ruff and mypy check them."""
