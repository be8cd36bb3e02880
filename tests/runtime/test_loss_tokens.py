"""``pipe.loader(accumulation_steps=k)``: each batch's ``num_items_in_batch`` is HF ``Trainer``'s count of its window.

Two ranks summing their counts run under ``torchrun`` in tests/runtime/test_loss_tokens_torchrun.py.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchdata.nodes import IterableWrapper

import padpipe as pp
from padpipe import Consumer
from padpipe.integrations.hf_hooks import loss_shifts_labels
from padpipe.runtime.loss_tokens import LossTokens, label_tokens
from padpipe.state import StateMismatchError, seal
from tests.contract import check_loader_resume, check_node_resume

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(300)

VOCAB = 64


def rows(count: int = 20) -> list[dict]:
    """Pre-tokenized rows of varied length, each with its prompt masked from the loss (token-level ``labels``)."""
    out = []
    for i in range(count):
        ids = [2 + (i * 5 + j * 3) % (VOCAB - 2) for j in range(1 + (i * 7) % 9)]
        prompt = min(i % 4, len(ids))
        out.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:], "idx": i})
    return out


def pipelines() -> dict[str, pp.Pipeline]:
    tokens = pp.from_iterable(rows()).shuffle(8, seed=1).tokens(pad_id=0)
    unmasked = [{"input_ids": r["input_ids"]} for r in rows()]  # pack() builds its own labels (no prompt mask)
    packed = pp.from_iterable(unmasked).shuffle(8, seed=1).tokens(pad_id=0).pack(13, batch_size=1)
    masked = tokens.pack(13, batch_size=2, keep=("idx",))  # each document keeps its prompt mask
    return {"padded": tokens.batch(2).pad(), "packed": packed, "packed_masked": masked}  # 10, 8 and 4 batches


@pytest.fixture(scope="module")
def trainers(tmp_path_factory) -> dict[bool, transformers.Trainer]:
    """HF ``Trainer`` s of a tiny causal LM (its loss shifts labels) and a tiny masked LM (it does not), by that."""
    args = transformers.TrainingArguments(
        str(tmp_path_factory.mktemp("hf")), use_cpu=True, report_to=[], disable_tqdm=True
    )
    return {
        causal: transformers.Trainer(model=model(), args=args)
        for causal, model in ((True, tiny_llama), (False, tiny_masked_lm))
    }


def tiny_llama() -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return transformers.LlamaForCausalLM(config)


def tiny_masked_lm() -> transformers.PreTrainedModel:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return transformers.BertForMaskedLM(config)


def windows_of(loader, k: int) -> list[list[dict]]:
    batches = list(loader)
    return [batches[i : i + k] for i in range(0, len(batches), k)]


@pytest.mark.parametrize("kind", ["padded", "packed", "packed_masked"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "masked"])
def test_num_items_in_batch_is_hf_trainers_own_count_of_the_window(trainers, kind, causal):
    trainer = trainers[causal]
    assert loss_shifts_labels(trainer, transformers.__version__) is causal  # HF shifts for the causal LM only
    loader = pipelines()[kind].loader(accumulation_steps=3, causal=causal)
    for _ in range(2):  # two epochs: windows start again with each
        windows = windows_of(loader, 3)
        assert len(windows[-1]) < 3, "the epoch's last window is short"
        for window in windows:
            hf = trainer._get_num_items_in_batch([dict(b) for b in window], torch.device("cpu"))
            assert int(hf) > 0
            for batch in window:
                items = batch["num_items_in_batch"]
                assert items.dtype == torch.int64 and items.dim() == 0 and int(items) == int(hf)


def test_the_short_last_window_counts_only_its_own_batches():
    batches = [{"labels": torch.tensor([[-100, 1, 2, 3][: 1 + n]])} for n in (3, 2, 1, 3, 2)]  # 3, 2, 1, 3, 2 tokens
    node = LossTokens(IterableWrapper(batches), steps=2)
    assert [int(b["num_items_in_batch"]) for b in node] == [5, 5, 4, 4, 2]


@pytest.mark.parametrize("kind", ["padded", "packed", "packed_masked"])
def test_a_loader_resumed_at_every_step_of_a_window_gives_the_same_batches_and_counts(kind):
    pipe = pipelines()[kind]
    check_loader_resume(lambda: pipe.loader(accumulation_steps=3))


def test_loss_tokens_saves_and_restores_its_state():
    batches = [{"labels": torch.tensor([[-100] + [7] * n])} for n in range(1, 8)]
    check_node_resume(lambda: LossTokens(IterableWrapper(batches), steps=3), epochs=2)


def test_label_tokens_counts_as_hf_shift_labels_first_and_repeats_as_zero():
    labels = torch.tensor([[5, 6, -100, 7]])
    assert label_tokens({"labels": labels}) == 2  # labels[..., 1:]
    assert label_tokens({"labels": labels}, causal=False) == 3
    assert label_tokens({"labels": labels, "shift_labels": torch.tensor([[6, -100, 7, -100]])}) == 2
    assert label_tokens({"labels": labels, "is_repeat": torch.tensor(True)}) == 0  # equal_steps="repeat": loss zeroed


def test_loader_raises_error_when_a_batch_has_no_labels():
    pipe = pp.from_iterable([{"input_ids": [2, 3]}]).tokens(pad_id=0).batch(1).pad()
    with pytest.raises(
        ValueError,
        match=r"^`accumulation_steps` counts the loss tokens of each batch's `labels`, but a batch has none: "
        r"expected a dict with `labels`, found \['attention_mask', 'input_ids'\] instead\.$",
    ):
        next(iter(pipe.loader(accumulation_steps=2)))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"accumulation_steps": 0},
            ValueError,
            r"^`accumulation_steps` must be greater than zero, but is 0 instead\.$",
        ),
        (
            {"accumulation_steps": 2.0},
            TypeError,
            r"^`accumulation_steps` must be an int, but is 2\.0 of type float instead\.$",
        ),
        ({"accumulation_steps": 2, "causal": "yes"}, TypeError, r"^`causal` must be a bool, but is 'yes' instead\.$"),
        (
            {"causal": False},
            ValueError,
            r"^`causal=False` says how `accumulation_steps` counts loss tokens, but `accumulation_steps` is None",
        ),
    ],
)
def test_loader_raises_error_when_accumulation_options_are_wrong(options, error, message):
    with pytest.raises(error, match=message):
        pipelines()["padded"].loader(**options)


def test_a_state_saved_with_other_accumulation_steps_is_refused():
    pipe = pipelines()["padded"]
    for saved, found in ((None, "'<missing>'"), (3, "3")):
        loader = pipe.loader(accumulation_steps=saved)
        next(iter(loader))
        with pytest.raises(
            StateMismatchError,
            match=rf"^PipelineLoader state doesn't match this pipeline: setting 'accumulation_steps' found {found} "
            r"instead of 2\.$",
        ):
            pipe.loader(accumulation_steps=2).load_state_dict(loader.state_dict())


def test_an_elastic_resume_inside_a_window_reads_every_row_once_and_starts_new_windows(tmp_path):
    """2 ranks save inside their second window; 1 rank reads the rest (their windows' batches first), recounted."""
    table = pa.Table.from_pylist([{**row, "rid": i} for i, row in enumerate(rows(40))])
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=10)
    pipe = pp.read_parquet(str(tmp_path / "rows.parquet")).tokens(pad_id=0).batch(2).pad()
    before, states = [], []
    for rank in range(2):
        loader = pipe.loader(consumer=Consumer(rank=rank, world_size=2), accumulation_steps=3)
        it = iter(loader)
        before += [next(it)["rid"].tolist() for _ in range(4)]  # inside the second window
        states.append(loader.state_dict())
    resumed = pipe.loader(consumer=Consumer(rank=0, world_size=1), accumulation_steps=3)
    resumed.load_state_dict(states)
    windows = windows_of(resumed, 3)
    after = [b["rid"].tolist() for w in windows for b in w]
    assert sorted(r for b in before + after for r in b) == list(range(40))
    for window in windows:
        counted = sum(int(b["labels"][..., 1:].ne(-100).sum()) for b in window)
        assert [int(b["num_items_in_batch"]) for b in window] == [counted] * len(window)


def test_a_transformers_causal_lm_divides_its_summed_loss_by_the_batch_num_items_in_batch(trainers):
    """``model(**batch)`` passes the count to HF's loss: the docs' "transformers models take it themselves"."""
    model = trainers[True].model
    batch = next(iter(pipelines()["padded"].loader(accumulation_steps=3)))
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    summed = torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1), reduction="sum"
    )
    torch.testing.assert_close(model(**batch).loss, summed / batch["num_items_in_batch"])


def test_a_loader_with_worker_processes_resumes_inside_a_window():
    pipe = pipelines()["packed"]
    check_loader_resume(lambda: pipe.loader(num_workers=2, accumulation_steps=3), epochs=1, steps=[1, 4])


@pytest.mark.parametrize("batch", [5, [1, 2], {"input_ids": [1, 2]}], ids=["int", "list", "no-labels"])
def test_loss_tokens_raises_state_mismatch_for_a_resealed_window_batch_without_labels(batch):
    """A window batch that is no labelled dict, checksum recomputed: named as the state's fault, not a TypeError."""
    batches = [{"labels": torch.tensor([[-100, 7, 7]])} for _ in range(4)]
    node = LossTokens(IterableWrapper(batches), steps=3)
    next(node)
    state = node.state_dict()
    state = seal({**state, "window": [batch, *state["window"][1:]]})
    with pytest.raises(
        StateMismatchError,
        match=r"^LossTokens state is invalid: 'window' must be a list of items, each a batch dict with `labels`, "
        r"`shift_labels` or `completion_mask`, but is .+ at index 0 instead\.$",
    ):
        LossTokens(IterableWrapper(batches), steps=3).reset(state)


def test_packed_masked_rows_count_exactly_the_trained_tokens_of_their_documents():
    """Each document alone trains its labels after the first that are not -100; packed, the windows sum to that."""
    alone = sum(sum(label != -100 for label in r["labels"][1:]) for r in rows())
    for kind in ("padded", "packed_masked"):
        windows = windows_of(pipelines()[kind].loader(accumulation_steps=3), 3)
        assert sum(int(w[0]["num_items_in_batch"]) for w in windows) == alone == 65, kind
    masked = [{"input_ids": r["input_ids"], "labels": [-100] * len(r["input_ids"])} for r in rows(6)]
    tokens = pp.from_iterable(masked).tokens(pad_id=0)
    for batches in (tokens.batch(2).pad(), tokens.pack(13, batch_size=1)):
        assert {int(b["num_items_in_batch"]) for b in batches.loader(accumulation_steps=2)} == {0}
