# Config resolvers (``${precision_for:...}`` in conf/trainer/ddp.yaml) must exist before any
# config is resolved: run.py, its relaunched DDP ranks and the tests all import harness first.
from harness.scaleout import register_resolvers

register_resolvers()
