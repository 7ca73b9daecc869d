"""`python -m benchmarks.scale -h`."""

import sys

from benchmarks.scale.cli import main

sys.exit(main())
