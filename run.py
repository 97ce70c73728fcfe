"""posbench entry point: ``python run.py [overrides]`` or ``python run.py -m pos=rope,learned``.

``python run.py --check [overrides]`` validates a config (or, with -m, every cell of a sweep) without
training; ``python run.py --matrix`` (or ``--matrix=md``) prints which pos × attn pairings train.
An installed copy (``pip install .``) has the same command as ``posbench``: both are harness/main.py.
"""

import sys

from harness.main import main

if __name__ == "__main__":
    sys.exit(main())
