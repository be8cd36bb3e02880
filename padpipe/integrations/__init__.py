"""Adapters for training frameworks, each importing its framework lazily.

- :mod:`padpipe.hf`: ``Trainer``, a ``transformers.Trainer`` that reads pipelines with padpipe's loader.
- Lightning needs no adapter: a ``pipe.loader()`` returned from ``train_dataloader()`` resumes
  exactly from Lightning's checkpoints (:mod:`padpipe.integrations.lightning_fit`, the loader's hook).
  :mod:`padpipe.integrations.lightning`: ``LightningLoader`` and ``ExactResume`` do the same for other
  stateful loaders (a ``StatefulDataLoader``).
- Accelerate needs no adapter: ``accelerator.prepare(model, optimizer, pipe.loader())`` passes the
  loader through. A ``DataLoader(pipe)`` given to ``prepare`` with several processes would be sharded
  twice; :func:`padpipe.integrations.guard.check_caller` stops that with an error naming the fix.

Importing this package (``import padpipe`` does) fills the core's registry of drivers
(:mod:`padpipe.drivers`): Lightning's fit-loop driver and the checks of who iterates a pipeline.
Neither imports its framework; each answers only while its framework, already imported, calls.
"""

from padpipe.drivers import register_loader_driver, register_pipeline_check
from padpipe.integrations.guard import check_caller
from padpipe.integrations.lightning_fit import fit_driver

register_loader_driver(fit_driver)
register_pipeline_check(check_caller)
