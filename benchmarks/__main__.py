"""`python -m benchmarks`: the trace replay bench (`benchmarks.cli`), run from the source tree."""

import sys

from benchmarks.cli import main

sys.exit(main())
