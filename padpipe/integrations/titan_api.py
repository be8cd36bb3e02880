"""Every contact of padpipe with torchtitan's API, in one table (:data:`CONTACTS`), checked at import.

:func:`check_api` raises ``ImportError`` naming the contact where an installed torchtitan differs in
what can be checked without a trainer; tests/integrations/test_torchtitan_api.py pins every row.
"""

from __future__ import annotations

import dataclasses
import inspect
from types import ModuleType

VERSION = "0.3.0"
"""The torchtitan release the adapter is written and tested against."""

INSTALL = f"pip install 'padpipe[torchtitan]' && pip install --no-deps torchtitan=={VERSION}"
"""How to install it beside padpipe: torchtitan without its own requirements (an older ``datasets``, tensorboard,
wandb), and the packages its import needs (``[torchtitan]``: tyro, spmd_types)."""

CONTACTS: dict[str, str] = {
    "components.dataloader.BaseDataLoader": "subclassed: Stateful (state_dict, load_state_dict), abstract __iter__, "
    "and a Config dataclass (fields dataset, dataset_path) that subclasses extend with kw_only, slots",
    "config.Configurable.Config.build": "build(**kwargs) calls the owning class as owner(config=..., **kwargs)",
    "trainer.Trainer.__init__": "config.dataloader.build(dp_world_size=, dp_rank=, tokenizer=, seq_len=, "
    "local_batch_size=, snapshot_every_n_steps=), local_batch_size being the pipeline micro-batch size under PP",
    "trainer.Trainer.batch_generator": "iter(loader) once; StopIteration from it becomes DataloaderExhaustedError, "
    "which ends training",
    "trainer.Trainer.train_step": "takes gradient_accumulation_steps x num_pipeline_parallel_microbatches batches "
    "per optimizer step and counts the tokens to train as labels != IGNORE_INDEX",
    "trainer.Trainer.post_dataloading_process": "the model gets input_dict['input'], and the other keys "
    "(positions) as keyword arguments",
    "components.loss.IGNORE_INDEX": "-100, the label the loss leaves out",
    "components.checkpoint.DATALOADER": "'dataloader', the key CheckpointManager saves the loader under with DCP",
    "components.tokenizer.HuggingFaceTokenizer": "built from tokenizer_path; tokenizer (a tokenizers.Tokenizer), "
    "bos_id, eos_id, bos_token, eos_token, hf_adds_bos, hf_adds_eos: encode(text, add_bos=True, add_eos=True) adds "
    "BOS and EOS where the tokenizer's own template does not",
    "tyro.conf.Suppress": "hides the Config's pipeline callable from torchtitan's command line (as ChatDataLoader's)",
}
"""What the adapter relies on, by object (module paths under ``torchtitan.`` but ``tyro``)."""

TOKENIZER_ATTRIBUTES = ("tokenizer", "bos_id", "eos_id", "bos_token", "eos_token", "hf_adds_bos", "hf_adds_eos")


def check_api(
    dataloader: ModuleType, config: ModuleType, loss: ModuleType, checkpoint: ModuleType, tokenizer: ModuleType
) -> None:
    """Raise ``ImportError`` naming the contact when the installed torchtitan modules differ from :data:`CONTACTS`."""
    base = dataloader.BaseDataLoader
    fields = {f.name for f in dataclasses.fields(base.Config)}
    _expect(
        "components.dataloader.BaseDataLoader",
        inspect.isabstract(base)
        and "__iter__" in base.__abstractmethods__
        and {"dataset", "dataset_path"} <= fields
        and issubclass(base.Config, config.Configurable.Config)
        and callable(getattr(base, "state_dict", None))
        and callable(getattr(base, "load_state_dict", None)),
    )
    _expect("config.Configurable.Config.build", callable(getattr(config.Configurable.Config, "build", None)))
    _expect("components.loss.IGNORE_INDEX", getattr(loss, "IGNORE_INDEX", None) == -100)
    _expect("components.checkpoint.DATALOADER", getattr(checkpoint, "DATALOADER", None) == "dataloader")
    made = getattr(tokenizer, "HuggingFaceTokenizer", None)
    _expect(
        "components.tokenizer.HuggingFaceTokenizer",
        made is not None and "tokenizer_path" in inspect.signature(made.__init__).parameters,
    )


def _expect(contact: str, holds: bool) -> None:
    if not holds:
        raise ImportError(
            f"padpipe.integrations.torchtitan is written for torchtitan {VERSION}, but the installed torchtitan's "
            f"{contact} differs: expected {CONTACTS[contact]}."
        )
