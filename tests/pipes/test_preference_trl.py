"""``.preference()`` against TRL 1.16's DPO and KTO data paths, on the real templates ``.chat()`` is tested on.

- Ids and completion masks: TRL's own ``DPOTrainer._prepare_dataset`` (its ``map`` pre-pass: ``extract_prompt``, the
  EOS it adds, its tokenization and prefix check) and its ``DataCollatorForPreference``, on 300 pairs per template
  (3,600 in all): equal wherever TRL's prefix check passes; where it warns (the prompt rendered alone is no prefix of
  the pair's rendering: DeepSeek-R1's ``<think>`` generation prompt, Mistral's system message moved to the last user
  turn), equal to a reference that knows each template's answer header, and counted as ``prompt_not_prefix``.
- Log-probabilities: a tiny model's per-sequence completion log-probabilities from padpipe's packed batches equal
  those TRL computes (``compute_ref_log_probs``) on its padded batches.
- The loss: TRL's ``DPOTrainer.compute_loss`` gives the same loss on padpipe's padded batches as on its own, and
  TRL's loss code, fed the log-probabilities of padpipe's packed batches, the same again.
"""

from __future__ import annotations

import copy
import random
import re
import types
from typing import Any

import numpy as np
import pytest
import torch

import padpipe as pp
from padpipe.chat.pairs import split_prompt
from tests.chat import real_templates as rt

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
from trl.data_utils import _tokenize, common_prefix_length  # noqa: E402
from trl.trainer.dpo_trainer import DPOTrainer  # noqa: E402
from trl.trainer.kto_trainer import KTOTrainer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

N = 300


def pair_rows(name: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Pairs of template ``name``'s conversations (system messages, several turns, reasoning, tool calls in the
    prompt): the last answer chosen, the next conversation's last answer rejected."""
    chats = rt.conversations(name, n + 1, seed=seed)
    out = []
    for i, (chat, after) in enumerate(zip(chats, chats[1:])):
        rejected = {k: v for k, v in after[-1].items() if k != "tool_calls"}
        out.append({"prompt": chat[:-1], "chosen": chat[-1:], "rejected": [rejected], "id": i})
    return out


def trl_config(tmp_path: Any, **options: Any) -> Any:
    return trl.DPOConfig(str(tmp_path), max_length=None, use_cpu=True, bf16=False, report_to=[], **options)


def trl_dataset(trainer: type, tok: Any, rows: list[dict[str, Any]], tmp_path: Any) -> list[dict[str, Any]]:
    """TRL's own pre-pass over ``rows`` (``_prepare_dataset``: the one method that reads ``self`` only for the
    tokenizer's EOS)."""
    config = trl_config(tmp_path) if trainer is DPOTrainer else trl.KTOConfig(str(tmp_path), max_length=None,
                                                                              use_cpu=True, bf16=False, report_to=[])  # fmt: skip
    data = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "id"} for r in rows])
    trainer_self = types.SimpleNamespace(
        _tokenizer=tok, calculate_KL=False, undesirable_weight=1.0, desirable_weight=1.0
    )
    return list(trainer._prepare_dataset(trainer_self, data, tok, config, "train"))


def ours(pipe: pp.Pipeline) -> tuple[dict[tuple[int, str], tuple[list[int], list[int]]], Any]:
    """Each member of a padded preference pipeline by ``(id, "chosen" | "rejected")``, and the loader's stats."""
    loader = pipe.batch(64).pad(pad_id=0).loader()
    out = {}
    for batch in loader:
        for i in range(len(batch["chosen"])):
            real = batch["attention_mask"][i].bool()
            key = (int(batch["id"][i]), "chosen" if bool(batch["chosen"][i]) else "rejected")
            out[key] = (batch["input_ids"][i][real].tolist(), batch["completion_mask"][i][real].tolist())
    return out, loader.stats()


def reference(name: str, tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[list[int], list[int]]:
    """The template's ids of ``messages``; its completion: every token after the last answer's header (for Qwen3
    without thinking, after the empty think block its generation prompt holds) to the end of the rendering."""
    text = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    start = [m.end() for m in re.finditer(rt.MODELS[name].header, text)][-1]
    if kwargs.get("enable_thinking") is False and text.startswith("<think>\n\n</think>\n\n", start):
        start += len("<think>\n\n</think>\n\n")
    encoding = rt.fx.offsets_tokenizer(tok).encode(text, add_special_tokens=False)
    return encoding.ids, [int(end > start) for _, end in encoding.offsets]


CASES = [(name, {}) for name in sorted(rt.MODELS)] + [("qwen3", {"enable_thinking": False})]


@pytest.mark.slow  # 3,600 pairs through TRL's pre-pass and padpipe: seconds each template
@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[f"{n}{'-no-thinking' if k else ''}" for n, k in CASES])
def test_preference_ids_and_masks_are_trls_where_its_prefix_check_passes_and_right_where_it_warns(
    tmp_path, name, kwargs
):
    tok, rows = rt.tokenizer(name), pair_rows(name, N)
    if kwargs:
        rows = [{**r, "chat_template_kwargs": kwargs} for r in rows]
    got, stats = ours(pp.from_iterable(rows).preference(tok))
    assert stats.skipped == {} and stats.counters["preference.rows"] == N
    trl_rows = trl_dataset(DPOTrainer, tok, rows, tmp_path)
    warned = 0
    for row, theirs in zip(rows, trl_rows):
        prompt_ids = _tokenize(tok, row["prompt"], add_generation_prompt=True, **kwargs)["input_ids"]  # TRL's check
        full = {m: _tokenize(tok, row["prompt"] + row[m], **kwargs)["input_ids"] for m in ("chosen", "rejected")}
        passes = all(common_prefix_length(prompt_ids, ids) == len(prompt_ids) for ids in full.values())
        warned += not passes
        for member in ("chosen", "rejected"):
            ids = theirs["prompt_ids"] + theirs[f"{member}_ids"]
            assert got[row["id"], member][0] == ids, "the ids are always TRL's: the template's rendering"
            if passes:
                mask = [0] * len(theirs["prompt_ids"]) + [1] * len(theirs[f"{member}_ids"])
                assert got[row["id"], member][1] == mask
            assert got[row["id"], member] == reference(name, tok, row["prompt"] + row[member], **kwargs)
    assert stats.counters.get("preference.prompt_not_prefix", 0) == warned
    if name in ("deepseek_r1_distill", "mistral_v0_3"):
        assert warned > 0, "a template whose prompt alone renders otherwise"


@pytest.mark.slow
def test_preference_plain_text_and_implicit_prompts_are_trls(tmp_path):
    """Plain text: ``prompt + completion + eos`` tokenized with the special tokens; where TRL's token prefix check
    fails (an implicit prompt's common start can end inside a word), the completion is every token that holds one of
    its characters."""
    tok, rng = rt.tokenizer("llama3_1"), random.Random(1)
    sentences = rt.fx.sentences()
    rows = [{"prompt": rng.choice(sentences), "chosen": " " + rng.choice(sentences), "rejected": " " + rng.choice(sentences),
             "id": i} for i in range(N)]  # fmt: skip
    implicit = [
        {"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"], "id": r["id"]} for r in rows
    ]
    for data in (rows, implicit):
        got, stats = ours(pp.from_iterable(data).preference(tok))
        warned = 0
        for row, theirs in zip(data, trl_dataset(DPOTrainer, tok, data, tmp_path)):
            (prompt, chosen), (_, rejected) = split_prompt(row["chosen"], row["rejected"]) if (
                "prompt" not in row) else ((row["prompt"], row["chosen"]), (row["prompt"], row["rejected"]))  # fmt: skip
            prompt_ids = tok(prompt)["input_ids"]
            texts = {"chosen": prompt + chosen + tok.eos_token, "rejected": prompt + rejected + tok.eos_token}
            passes = all(tok(t)["input_ids"][: len(prompt_ids)] == prompt_ids for t in texts.values())
            warned += not passes
            for member, text in texts.items():
                ids = theirs["prompt_ids"] + theirs[f"{member}_ids"]
                mask = [0] * len(theirs["prompt_ids"]) + [1] * len(theirs[f"{member}_ids"])
                assert got[row["id"], member][0] == ids
                if passes:
                    assert got[row["id"], member][1] == mask
                spans = tok(text, return_offsets_mapping=True)["offset_mapping"]
                assert got[row["id"], member][1] == [int(end > len(prompt)) for _, end in spans]
        assert stats.counters["preference.rows"] == N and stats.skipped == {}
        assert stats.counters.get("preference.prompt_not_prefix", 0) == warned
        assert (warned > 0) == (data is implicit), "an implicit prompt's common start may end inside a word"


def test_preference_unpaired_rows_are_trls_kto_rows(tmp_path):
    tok, pairs = rt.tokenizer("qwen2_5"), pair_rows("qwen2_5", 60)
    rows = [{"prompt": r["prompt"], "completion": r["chosen"], "label": r["id"] % 3 != 0, "id": r["id"]} for r in pairs]
    loader = pp.from_iterable(rows).preference(tok, unpaired=True).batch(60).pad(pad_id=0).loader()
    batch = next(iter(loader))
    for i, (row, theirs) in enumerate(zip(rows, trl_dataset(KTOTrainer, tok, rows, tmp_path))):
        real = batch["attention_mask"][i].bool()
        ids = theirs["prompt_ids"] + theirs["completion_ids"]
        assert batch["input_ids"][i][real].tolist() == ids
        assert batch["labels"][i][real].tolist() == [-100] * len(theirs["prompt_ids"]) + theirs["completion_ids"]
        assert int(batch["label"][i]) == int(row["label"]) == int(theirs["label"])


def tiny_trainer(tok: Any, rows: list[dict[str, Any]], tmp_path: Any, dtype: torch.dtype) -> Any:
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, max_position_embeddings=4096)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    data = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "id"} for r in rows])
    args = trl_config(tmp_path, beta=0.1, per_device_train_batch_size=len(rows))
    return DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=data, processing_class=tok)


def packed_logps(model: Any, tok: Any, rows: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    out = {}
    pipe = pp.from_iterable(rows).preference(tok).pack(2048, batch_size=2, keep=("id",), pad_id=0)
    with torch.no_grad():
        for batch in pipe.loader():
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
            chosen, rejected = pp.pair_logps(logits, batch)
            out.update(zip([i for row in batch["id"] for i in row], zip(chosen.tolist(), rejected.tolist())))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_packed_log_probabilities_are_those_trl_computes_on_its_padded_batches(tmp_path, name):
    """fp32: TRL's own ``compute_ref_log_probs`` on its collator's batch and ``pp.pair_logps`` on padpipe's packed
    rows agree within 1e-5 of the sums' size (fp32 resolves a sum of -400 to 3e-5); float64, the same computation
    on both layouts agrees to 1e-9."""
    tok, rows = rt.tokenizer(name), pair_rows(name, 40)
    trainer = tiny_trainer(tok, rows, tmp_path, torch.float32)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(rows))])
    with torch.no_grad():
        chosen, rejected = trainer.compute_ref_log_probs(trainer.model, batch)
    packed = packed_logps(trainer.model, tok, rows)
    for row, c, r in zip(rows, chosen.tolist(), rejected.tolist()):
        assert packed[row["id"]] == pytest.approx((c, r), rel=1e-5)
    model = transformers.LlamaForCausalLM(trainer.model.config)  # TRL's own forward (its fused head) computes in fp32
    model.load_state_dict(trainer.model.state_dict())
    model = model.double().eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        padded = pp.pair_logps(logits, {**batch, "chosen": torch.arange(2 * len(rows)) < len(rows)})
    packed = packed_logps(model, tok, rows)
    for row, c, r in zip(rows, *(t.tolist() for t in padded)):
        assert packed[row["id"]] == pytest.approx((c, r), abs=1e-9)


class PackedForward(torch.nn.Module):
    """What TRL's DPO loss calls as its model: it runs ``model`` on padpipe's packed batches of the same pairs and
    gives each row of TRL's padded batch its per-token log-probabilities from them (TRL's fused head's output)."""

    def __init__(self, model: Any, tok: Any, rows: list[dict[str, Any]]) -> None:
        super().__init__()
        self.model, self.members = model, {}
        pipe = pp.from_iterable(rows).preference(tok).pack(2048, batch_size=2, keep=("id",), pad_id=0)
        for batch in pipe.loader():
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
            logps = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
            flat = torch.cat([torch.zeros(len(logps), 1), logps], 1).reshape(-1)  # token t's: from t - 1
            bounds, ids = batch["cu_seq_lens_q"].tolist(), batch["input_ids"].reshape(-1)
            for a, b in zip(bounds, bounds[1:]):
                self.members[tuple(ids[a:b].tolist())] = flat[a:b]

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **_: Any) -> Any:
        log_probs = torch.zeros(labels.shape[0], labels.shape[1] - 1)
        for r, (ids, mask) in enumerate(zip(input_ids, labels != -100)):
            n = int(mask.nonzero().max()) + 1
            log_probs[r, : n - 1] = self.members[tuple(ids[:n].tolist())][1:] * mask[1:n]
        zeros = torch.zeros_like(log_probs)
        return types.SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())


@pytest.mark.slow
def test_trls_dpo_loss_is_the_same_on_padpipes_padded_and_packed_batches(tmp_path):
    tok, rows = rt.tokenizer("qwen3"), pair_rows("qwen3", 24)
    trainer = tiny_trainer(tok, rows, tmp_path, torch.float32)
    with torch.no_grad():
        model = trainer.model
        trl_batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(rows))])
        padded = next(iter(pp.from_iterable(rows).preference(tok).batch(len(rows)).pad(pad_id=0).loader()))
        padded = {k: padded[k] for k in ("input_ids", "attention_mask", "completion_mask")}
        assert all(torch.equal(trl_batch[k], padded[k]) for k in padded), "TRL's collator layout, exactly"
        loss = trainer.compute_loss(model, trl_batch)
        assert trainer.compute_loss(model, padded) == loss
        trainer.ref_model = PackedForward(trainer.ref_model, tok, rows)
        packed = trainer.compute_loss(PackedForward(model, tok, rows), padded)
    assert float(packed) == pytest.approx(float(loss), abs=1e-6)
    assert np.isfinite(float(loss)) and float(loss) > 0
