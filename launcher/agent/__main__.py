"""`python -S -m launcher.agent ...`: the agent's process (launcher/agent/main.py)."""

import sys

from launcher.agent.main import main

sys.exit(main())
