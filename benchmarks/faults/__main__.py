"""`python -m benchmarks.faults`: see `benchmarks.faults`."""

from benchmarks.faults.cli import main

raise SystemExit(main())
