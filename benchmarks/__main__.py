"""`python -m benchmarks`: the trace replay bench (`benchmarks.cli`), run from the source tree; `python -m benchmarks
dra ...`: the DRA arm (`benchmarks.dra_bench`)."""

import sys

if sys.argv[1:2] == ["dra"]:
    from benchmarks.dra_bench import main as dra_main

    sys.exit(dra_main(sys.argv[2:]))

from benchmarks.cli import main  # noqa: E402 - only the replay bench needs it

sys.exit(main())
