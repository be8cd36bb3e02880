"""``padpipe check-packing MODEL --data DATA``: :func:`padpipe.check_packing` on a local model folder or config.

A folder with weights loads them (local files only); a ``config.json`` builds the model with random
weights, which is enough: the check finds how the attention code reads packed rows. Exit status 0
when every document gets its own logits, 1 when not (the cause and fix on standard error).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from typing import Any

import torch

from padpipe import _shipped
from padpipe.inspection.packing_causes import transformers_private
from padpipe.inspection.packing_check import PackingError, check_packing
from padpipe.inspection.sample import source_pipeline

WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


def run(args: argparse.Namespace) -> int:
    """Load the model and data the arguments name, run the check, print its report; 1 when it fails."""
    model = load_model(args.model, attn_implementation=args.attn_implementation, dtype=args.dtype, device=args.device)
    if args.use_cache is not None:
        model.config.use_cache = args.use_cache == "true"
    tokenizer = args.tokenizer or (args.model if os.path.isdir(args.model) else None)
    if tokenizer is None:
        raise ValueError("check-packing: MODEL is a config file, so --tokenizer is needed; expected a tokenizer.")
    seq_len = args.seq_len
    mask_dtype = None if args.mask_dtype is None else getattr(torch, args.mask_dtype)
    tokens = source_pipeline(_shipped.data(args.data)).tokenize(
        _shipped.tokenizer(tokenizer), fields=args.field, max_length=args.max_length or seq_len // 4
    )
    packed = tokens.pack(seq_len, batch_size=args.batch_size, block_mask=args.block_mask, mask_dtype=mask_dtype)
    try:
        report = check_packing(model, packed.loader(), max_documents=args.max_documents)
    except PackingError as exc:
        if exc.report is not None:
            print(exc.report)
        print(f"padpipe check-packing: {exc}", file=sys.stderr)
        return 1
    print(report)
    return 0


def load_model(path: str, *, attn_implementation: str | None, dtype: str | None, device: str) -> Any:
    """The model ``path`` names: its weights when the folder has them, else built from its config.

    Example:
        >>> load_model("my-model/config.json", attn_implementation="sdpa", dtype=None, device="cpu")  # doctest: +SKIP
    """
    import transformers

    if not os.path.exists(path):
        raise FileNotFoundError(
            f"check-packing: MODEL {path!r}: no such file or folder; expected a model folder or a config.json."
        )
    try:  # before the model loads: a device this torch cannot use fails at once
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as exc:  # an unknown device, or one this torch was not built for
        raise ValueError(
            f"check-packing: --device {device!r}: {exc}; expected a device this torch can use (cpu, cuda, mps ...)."
        ) from None
    options: dict[str, Any] = {}
    if attn_implementation is not None:
        options["attn_implementation"] = attn_implementation
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True, **options)
    except (OSError, ValueError, KeyError) as exc:  # transformers' words for a folder or file that is no config
        first = str(exc).split(". ")[0].rstrip(".")
        raise ValueError(
            f"check-packing: MODEL {path!r} is not a model: {first}; expected a model folder with a config.json, "
            "or a config.json."
        ) from None
    head = _head(config)
    weights = os.path.isdir(path) and any(glob.glob(os.path.join(path, w)) for w in WEIGHTS)
    if weights:
        model = head.from_pretrained(path, config=config, local_files_only=True, **options)
    else:
        model = head.from_config(config, **options)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    return model.to(device)


def _head(config: Any) -> Any:
    import transformers

    architectures = getattr(config, "architectures", None) or []
    if any(a.endswith("ForMaskedLM") for a in architectures):
        return transformers.AutoModelForMaskedLM
    for head in (transformers.AutoModelForCausalLM, transformers.AutoModelForMaskedLM):
        if type(config) in transformers_private(head, "_model_mapping"):
            return head
    return transformers.AutoModel
