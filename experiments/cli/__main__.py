"""``python -m experiments.cli …`` is ``twinserve …``."""

import sys

from experiments.cli import main

sys.exit(main())
