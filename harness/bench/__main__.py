"""``python -m harness.bench``: see harness/bench/cli.py."""

import sys

from harness.allocator import keep_freed_memory
from harness.bench.cli import main
from harness.errors import ConfigError

try:
    keep_freed_memory()  # as run.py: what the benchmark times is what training gets (harness/allocator.py)
except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
sys.exit(main())
