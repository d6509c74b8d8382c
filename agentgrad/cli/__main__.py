"""`python -m agentgrad.cli ...`, as the `agentgrad` command."""

import sys

from agentgrad.cli.main import main

sys.exit(main())
