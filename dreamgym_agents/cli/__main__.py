"""``python -m dreamgym_agents.cli``: the ``dg-agents`` command, for launchers that run a
module (``torchrun -m``, ``accelerate launch -m``)."""

import sys

from dreamgym_agents.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
