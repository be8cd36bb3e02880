"""``pp.model_kind(model)``: does packing keep documents apart in this model, and what does it need?

A layer carries state across packed documents when transformers caches a conv or recurrent state for its
layer type, or it is one of :data:`RECURRENT_BLOCKS`; only the kernels of :data:`KERNELS` (on the devices of
:data:`PACKAGES`) keep documents apart there, which a one-time 16-token probe checks. The verdict is
:attr:`ModelKind.layout` (docs/packing.md).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import re
import sys
import textwrap
from typing import Any

import torch

KERNELS: dict[str, str | None] = {
    # the training kernels transformers hooks -> the argument that keeps documents apart in them (their docs)
    "causal_conv1d_fn": "seq_idx",  # causal-conv1d: seq_idx int32 [batch, seqlen], channel-last input
    "mamba_chunk_scan_combined": "seq_idx",  # mamba-ssm: seq_idx [batch, seqlen]
    "mamba_split_conv1d_scan_combined": "seq_idx",
    "chunk_gated_delta_rule": "cu_seqlens",  # flash-linear-attention: cu_seqlens [N + 1], batch size 1
    "chunk_kda": "cu_seqlens",
    "selective_scan_fn": None,  # Mamba v1's scan: no boundaries
    "mamba_inner_fn": None,
}
"""Training kernels and their boundary argument (``None``: they take none). Kernels whose names hold one of
:data:`DECODE` run one token at a time in generation and are not trained through."""
DECODE = ("_update", "fused_recurrent_")
PACKAGES = {
    # import name -> (pip name, device types its kernels run on: transformers' _PACKAGE_SUPPORTED_DEVICES)
    "causal_conv1d": ("causal-conv1d", ("cuda",)),
    "mamba_ssm": ("mamba-ssm", ("cuda",)),
    "fla": ("flash-linear-attention", ("cuda", "xpu", "mlu", "npu")),
}
RECURRENT_BLOCKS = ("RwkvSelfAttention", "xLSTMLayer")
"""Recurrent blocks of models whose configs declare no layer types (RWKV's time mixing, xLSTM's mLSTM)."""
HOOK = re.compile(r'@use_kernel_func_from_hub_with_fallback\(\s*"(\w+)",\s*"(\w+)"[^)]*\)\s*\ndef (\w+)')
BUCKET = ".bucket(max_tokens=...).pad(): one document a row, padding on the right"


@dataclasses.dataclass(frozen=True)
class ModelKind:
    """What keeps packed documents apart in a model (see the module docs); ``str()`` is the one-line verdict.

    Attributes:
        model: The model's class name.
        kind: ``"attention"`` (no layer carries state), ``"varlen"`` (layers that carry state get the
            boundaries in kernels that honour them) or ``"recurrent"`` (nothing keeps them apart).
        layers: The layers that carry state, in words (``"2 linear_attention layers (MambaMixer)"``).
        reason: Why they cannot be kept apart (``"recurrent"``), else ``""``.
        packages: The kernel packages the layers need (import names), for ``"varlen"``.
        missing: Those not importable, or not for ``device``.
        one_row: A kernel takes the boundaries for a batch of one row only (flash-linear-attention).
        device: The device type the kernels were checked for.
        mask_without_positions: The model builds its attention mask without ``position_ids``, so
            ``eager``/``sdpa`` attention finds no packed rows.
    """

    model: str
    kind: str
    layers: str = ""
    reason: str = ""
    packages: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    one_row: bool = False
    device: str = "cpu"
    mask_without_positions: bool = False

    @property
    def layout(self) -> str:
        """``"rows"``, ``"flat"`` or ``"bucket"``: how to batch for this model (the module docs)."""
        if self.kind == "recurrent" or self.missing:
            return "bucket"
        return "flat" if self.one_row else "rows"

    @property
    def why(self) -> str:
        """What keeps packed documents apart in the model, or does not: the verdict's first half."""
        if self.kind == "attention":
            if self.mask_without_positions:
                return (
                    f"{self.model} builds its attention mask without position_ids, so its eager/sdpa attention finds "
                    "no packed rows"
                )
            return f"{self.model} has attention layers only"
        head = f"{self.model}: state runs on from one document into the next in its {self.layers}"
        if self.kind == "recurrent":
            return f"{head}, and nothing keeps packed documents apart in them ({self.reason})"
        names = _listed(PACKAGES[p][0] for p in self.packages)
        if not self.missing:
            return f"{head}; the kernels of {names} keep them apart given seq_idx/cu_seq_lens"
        absent = [PACKAGES[p][0] for p in self.missing]
        return (
            f"{head}; only the kernels of {names} keep them apart (given seq_idx/cu_seq_lens), and {_listed(absent)} "
            f"{'is' if len(absent) == 1 else 'are'} not usable on {self.device} (not installed, or no kernel for it)"
        )

    @property
    def fix(self) -> str:
        """What to do: the verdict's second half."""
        if self.kind == "attention":
            if self.mask_without_positions:
                return "use attn_implementation='flash_attention_2' (it reads cu_seq_lens_*), or pack(block_mask=True)"
            return "pack() keeps documents apart, its batch as it is"
        if self.kind == "recurrent":
            return f"do not pack: {BUCKET}"
        layout = f"pack(..., layout={'flat' if self.one_row else 'rows'!r})"
        if self.mask_without_positions:  # its attention layers need cu_seq_lens_* too
            layout += " with attn_implementation='flash_attention_2' (its attention mask ignores position_ids)"
        if not self.missing:
            return layout + (" (flash-linear-attention takes the batch as one row)" if self.one_row else "")
        absent = " ".join(PACKAGES[p][0] for p in self.missing)
        return f"pip install {absent} and train on cuda with {layout}, or {BUCKET}"

    def __str__(self) -> str:
        return f"{self.why}; {self.fix}."


def _listed(names: Any) -> str:
    names = list(names)
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def model_kind(model: Any, *, device: str | torch.device | None = None, probe: bool = True) -> ModelKind:
    """What keeps packed documents apart in ``model`` (a transformers model or config), and the layout to use.

    Read from the config's layer types and the kernels transformers hooks in the model's code; for a
    model (not a config) with layers that carry state, one forward of 16 tokens checks which kernels
    get the document boundaries (``probe=False`` skips it).

    Args:
        model: A ``transformers`` model, or its config (built on the ``meta`` device to be read).
        device: The device the model will train on; default: the model's, or ``cuda`` when the model
            is on the CPU and CUDA is available.
        probe: Run the one-time probe (a model only).

    Example:
        >>> import transformers
        >>> config = transformers.MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2)
        >>> kind = model_kind(config)
        >>> kind.kind, kind.layout
        ('recurrent', 'bucket')
        >>> print(kind)  # doctest: +NORMALIZE_WHITESPACE
        MambaForCausalLM: state runs on from one document into the next in its 2 linear_attention layers (MambaMixer),
        and nothing keeps packed documents apart in them (mamba_inner_fn and selective_scan_fn take no document
        boundaries); do not pack: .bucket(max_tokens=...).pad(): one document a row, padding on the right.
    """
    module = _as_module(model)
    target = _target_device(module, device)
    positions = not _mask_reads_positions(module)
    kind = functools.partial(ModelKind, type(module).__name__, device=target, mask_without_positions=positions)
    types = _state_layer_types(getattr(module, "config", None))
    blocks = [m for m in module.modules() if type(m).__name__ in RECURRENT_BLOCKS]
    if not types and not blocks:
        return kind("attention")
    layers = _describe(module, types, blocks)
    hooks = _training_hooks(module)
    kernels = sorted({kernel for _, _, kernel, _ in hooks})
    blind = [k for k in kernels if KERNELS.get(k) is None]
    if blocks or not hooks or blind:
        takes = f"{_listed(blind)} take{'s' if len(blind) == 1 else ''} no document boundaries"
        return kind("recurrent", layers, takes if blind else "no kernel of theirs takes any")
    if probe and not any(p.is_meta for p in module.parameters()):
        dropped = [k for k, got in _probe(module, hooks).items() if not got]
        if dropped:
            return kind("recurrent", layers, f"the model calls {_listed(dropped)} without {KERNELS[dropped[0]]}")
    packages = tuple(sorted({package for _, package, _, _ in hooks}))
    missing = tuple(p for p in packages if not _usable(p, target))
    return kind("varlen", layers, "", packages, missing, any(KERNELS.get(k) == "cu_seqlens" for k in kernels))


def _as_module(model: Any) -> torch.nn.Module:
    """``model``, or a model built from a config on the ``meta`` device (no memory, no weights)."""
    if isinstance(model, torch.nn.Module):
        return model
    if type(model).__module__.startswith("transformers.") and hasattr(model, "to_dict"):
        import transformers

        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(model)
    raise TypeError(f"model_kind: `model` must be a transformers model or config, but is {type(model).__name__}.")


def _target_device(module: torch.nn.Module, device: str | torch.device | None) -> str:
    if device is not None:
        return torch.device(device).type
    found = next((p.device.type for p in module.parameters()), "cpu")
    if found in ("cpu", "meta"):  # not moved to its device yet (or a config's model)
        return "cuda" if torch.cuda.is_available() else "cpu"
    return found


def _state_layer_types(config: Any) -> list[str]:
    """The config's layer types that transformers gives a conv or recurrent state cache, one per such layer."""
    if config is None or not hasattr(config, "get_text_config"):
        return []
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, LinearAttentionCacheLayerMixin

    text = config.get_text_config()
    types = getattr(text, "layer_types", None) or []
    stateful = {
        t for t, layer in DYNAMIC_LAYER_TYPE_MAPPING.items() if issubclass(layer, LinearAttentionCacheLayerMixin)
    }
    return [t for t in types if t in stateful]


def _describe(module: torch.nn.Module, types: list[str], blocks: list[torch.nn.Module]) -> str:
    """``"2 linear_attention layers (MambaMixer)"``: the layer types and the classes that hold their state."""
    mixers = {type(m).__name__ for m in blocks}
    for owner in module.modules():  # the modules whose own depthwise convolution runs along the sequence
        if any(isinstance(c, torch.nn.Conv1d) and c.groups == c.in_channels > 1 for c in owner.children()):
            mixers.add(type(owner).__name__)
    counts = collections.Counter(types) or collections.Counter({"recurrent": len(blocks)})
    what = _listed(f"{n} {t} layer{'s' if n > 1 else ''}" for t, n in counts.items())
    return f"{what} ({', '.join(sorted(mixers))})" if mixers else what


def _training_hooks(module: torch.nn.Module) -> list[tuple[Any, str, str, str]]:
    """``(modeling module, package, kernel, python name)`` of every hooked training kernel in the model's code."""
    names = {type(m).__module__ for m in module.modules() if type(m).__module__.startswith("transformers.models.")}
    return [
        (code, package, kernel, python)
        for code in [sys.modules[n] for n in sorted(names) if n in sys.modules]
        for kernel, package, python in _hooks(code.__name__)
        if not any(part in kernel for part in DECODE)  # an unknown kernel counts as one without boundaries
    ]


@functools.lru_cache(maxsize=64)
def _hooks(module_name: str) -> tuple[tuple[str, str, str], ...]:
    return tuple(HOOK.findall(inspect.getsource(sys.modules[module_name])))


def _usable(package: str, device: str) -> bool:
    return importlib.util.find_spec(package) is not None and device in PACKAGES.get(package, ("", ()))[1]


def _probe(module: torch.nn.Module, hooks: list[tuple[Any, str, str, str]]) -> dict[str, bool]:
    """Run the model once on two packed documents, recording which hooked kernels get their boundary argument.

    Each hooked kernel is wrapped for the call (the wrapper records, then calls the kernel without
    the boundaries, which the torch fallbacks refuse); the output is not used.
    """
    seen: dict[str, bool] = {}

    def recording(kernel: str, original: Any) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            boundary = KERNELS.get(kernel)
            got = boundary is not None and kwargs.get(boundary) is not None
            seen[kernel] = seen.get(kernel, True) and got
            kwargs.pop("seq_idx", None)
            kwargs.pop("cu_seqlens", None)
            return original(*args, **kwargs)

        return record

    vocab = int(getattr(getattr(module, "config", None), "vocab_size", 0) or 0) or 16
    tokens = torch.arange(16, device=next(module.parameters()).device)
    bounds = torch.tensor([0, 8, 16], dtype=torch.int32, device=tokens.device)  # two documents of 8 tokens
    batch = dict(input_ids=(tokens % max(1, vocab - 3) + 3)[None], position_ids=(tokens % 8)[None], use_cache=False,
                 seq_idx=(tokens // 8).int()[None], cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=8,
                 max_length_k=8)  # fmt: skip
    training = module.training
    with contextlib.ExitStack() as stack:
        for code, _, kernel, python in hooks:
            stack.enter_context(_replaced(code, python, recording(kernel, getattr(code, python))))
        module.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                module(**batch)
        except Exception:  # a model the probe cannot run: its code's verdict stands
            return {}
        finally:
            module.train(training)
    return seen


@contextlib.contextmanager
def _replaced(code: Any, name: str, value: Any) -> Any:
    original = getattr(code, name)
    setattr(code, name, value)
    try:
        yield
    finally:
        setattr(code, name, original)


def _mask_reads_positions(module: torch.nn.Module) -> bool:
    """Whether the decoder's causal masks get ``position_ids`` (HF finds packed rows in them); ``True`` if unsure."""
    decoder = next((m for m in module.modules() if isinstance(getattr(m, "layers", None), torch.nn.ModuleList)), None)
    if decoder is None:
        return True
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(decoder).forward)))
    except (OSError, TypeError, SyntaxError):
        return True
    dicts = {
        target.id: {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if not getattr(call.func, "id", getattr(call.func, "attr", "")).endswith("causal_mask"):
            continue
        spread = [getattr(k.value, "id", "") for k in call.keywords if k.arg is None]
        if any(name not in dicts for name in spread):
            continue  # keyword arguments from elsewhere: unsure
        if "position_ids" not in {k.arg for k in call.keywords} | {key for name in spread for key in dicts[name]}:
            return False
    return True
