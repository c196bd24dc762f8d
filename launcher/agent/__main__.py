"""`python -S -m launcher.agent ...`: the agent's process (launcher/agent/main.py)."""

import sys

from launcher.agent.main import main

if __name__ == "__main__":  # run by -m or runpy as __main__; a plain import does nothing
    sys.exit(main())
