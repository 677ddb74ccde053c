"""``python -m jobs.demo``: the demo tour (:mod:`jobs.demo.tour`)."""

import sys

from jobs.demo.tour import main

if __name__ == "__main__":
    sys.exit(main())
