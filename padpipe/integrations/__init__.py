"""Adapters for training frameworks, each importing its framework lazily.

- :mod:`padpipe.hf`: ``Trainer``, a ``transformers.Trainer`` that reads pipelines with padpipe's loader.
- :mod:`padpipe.integrations.lightning`: ``LightningLoader`` and ``ExactResume`` for an exact resume
  under Lightning's default training loop.
- Accelerate needs no adapter: ``accelerator.prepare(model, optimizer, pipe.loader())`` passes the
  loader through. A ``DataLoader(pipe)`` given to ``prepare`` with several processes would be sharded
  twice; :func:`padpipe.integrations._guard.check_caller` stops that with an error naming the fix.
"""
