"""``padpipe.hf.Trainer``: Hugging Face's ``Trainer`` that reads padpipe pipelines as they are.

Pass pipelines that end in ``.pad()`` or ``.pack()`` as ``train_dataset``, ``eval_dataset`` or to
``predict``; any other dataset goes to ``transformers.Trainer`` unchanged. Needs ``transformers``
(``pip install 'padpipe[hf]'``); tested with transformers 5.18 to 5.25.

Example:
    >>> from padpipe.hf import Trainer  # doctest: +SKIP
    >>> trainer = Trainer(model=model, args=TrainingArguments("out", max_steps=100),  # doctest: +SKIP
    ...                   train_dataset=train, eval_dataset=val, compute_metrics=accuracy)
    >>> trainer.train(); trainer.predict(val).predictions  # doctest: +SKIP
"""

from padpipe.integrations.hf import LOADER_STATE, Trainer

__all__ = ["LOADER_STATE", "Trainer"]
