"""`python3 -m agent ...`: the agent's entry point (see `agent.cli`)."""

import sys

from agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
