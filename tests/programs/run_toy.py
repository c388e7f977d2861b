"""Report :func:`programs.toy.run_toy` for a JSON spec, in a fresh process
(a warm start). Its own module, so the pass class is ``programs.toy.RecordRange``
here as in the test process (run as ``__main__`` its uuid would differ).

    python -m programs.run_toy SPEC_JSON
"""

from __future__ import annotations

import json
import sys

from programs.report import report
from programs.toy import run_toy

if __name__ == "__main__":
    report(run_toy(json.loads(sys.argv[1])))
