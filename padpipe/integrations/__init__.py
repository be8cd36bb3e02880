"""Adapters for training frameworks, each importing its framework lazily.

- :mod:`padpipe.hf`: ``Trainer``, a ``transformers.Trainer`` that reads pipelines with padpipe's loader.
- Lightning: a ``pipe.loader()`` returned from ``train_dataloader()`` resumes exactly from Lightning's
  checkpoints with the ``ExactResume`` callback (:mod:`padpipe.integrations.lightning`), which also
  serves ``LightningLoader`` for other stateful loaders (a ``StatefulDataLoader``). Without it, a
  fit that will save or resumes the loader raises at its first batch, naming the callback.
- Accelerate needs no adapter: ``accelerator.prepare(model, optimizer, pipe.loader())`` passes the
  loader through. A ``DataLoader(pipe)`` given to ``prepare`` with several processes would be sharded
  twice; :func:`padpipe.integrations.guard.check_caller` stops that with an error naming the fix.

Importing this package (``import padpipe`` does) fills the core's registry of checks
(:mod:`padpipe.drivers`): who iterates a pipeline, and who iterates, saves or restores a loader. Neither
imports its framework, and each only raises or warns.
"""

from padpipe.drivers import register_loader_check, register_pipeline_check
from padpipe.integrations.guard import check_caller
from padpipe.integrations.loader_guard import check_loader_caller

register_pipeline_check(check_caller)
register_loader_check(check_loader_caller)
