"""Adapters for training frameworks, each importing its framework lazily (Accelerate needs none).

Importing this package (``import padpipe`` does) registers in :mod:`padpipe.drivers` the checks of who iterates
a pipeline and who iterates, saves or restores a loader; each only raises or warns.
"""

from padpipe.drivers import register_loader_check, register_pipeline_check
from padpipe.integrations.guard import check_caller
from padpipe.integrations.loader_guard import check_loader_caller

register_pipeline_check(check_caller)
register_loader_check(check_loader_caller)
