"""``python -m harness.bench``: see harness/bench/cli.py."""

import sys

from harness.allocator import keep_freed_memory
from harness.bench.cli import main
from harness.errors import ConfigError, said_refusal

try:
    keep_freed_memory()  # as run.py: what the benchmark times is what training gets (harness/allocator.py)
except ConfigError as e:
    sys.exit(said_refusal(e))
sys.exit(main())
