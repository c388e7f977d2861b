"""``python -m fxpiece``: the command line (see ``fxpiece --help``)."""

from fxpiece.cli import main

raise SystemExit(main())
