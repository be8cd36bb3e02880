import datasets
import pyarrow as pa
import pytest

import padpipe as pp
from padpipe import Consumer, DataError
from padpipe.readers.hf import HFDatasetReader, HFIterableReader, hf_reader
from tests.contract import check_node_resume
from tests.readers.checks import check_split, epoch_batches, rows


def records(n):
    return {"id": list(range(n)), "text": [f"text {i}" for i in range(n)], "label": [i % 2 for i in range(n)]}


@pytest.fixture
def dataset():
    return datasets.Dataset.from_dict(records(45))


def ids(batches):
    return [r["id"] for r in rows(batches)]


def test_from_hf_works_on_a_dataset(dataset):
    node = HFDatasetReader(dataset=dataset, chunk_rows=4, consumer=Consumer())
    [batches] = epoch_batches(node)
    assert rows(batches) == dataset.to_list()
    assert [b.num_rows for b in batches] == [4] * 11 + [1]
    assert [(u.start, u.stop) for u in node._units] == [(0, 32), (32, 45)]


def test_from_hf_works_on_a_shuffled_and_selected_dataset(dataset):
    view = dataset.shuffle(seed=0).select(range(5, 30))
    [batches] = epoch_batches(HFDatasetReader(dataset=view, columns=["label", "id"], chunk_rows=4, consumer=Consumer()))
    assert batches[0].schema.names == ["label", "id"]
    assert rows(batches) == [{"label": r["label"], "id": r["id"]} for r in view.to_list()]


def test_from_hf_works_on_a_dataset_loaded_from_disk(dataset, tmp_path):
    dataset.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    assert (
        rows(epoch_batches(HFDatasetReader(dataset=loaded, chunk_rows=7, consumer=Consumer()))[0]) == dataset.to_list()
    )


def test_from_hf_shuffles_units_per_epoch(dataset):
    def make():
        return HFDatasetReader(dataset=dataset, chunk_rows=2, seed=9, consumer=Consumer())

    first, second = epoch_batches(make(), epochs=2)
    assert sorted(ids(first)) == list(range(45)) == sorted(ids(second))
    assert ids(first) != ids(second)
    assert ids(epoch_batches(make())[0]) == ids(first)


def test_from_hf_splits_a_dataset_between_consumers(dataset):
    for seed in (None, 2):
        check_split(
            lambda c: HFDatasetReader(dataset=dataset, chunk_rows=2, seed=seed, consumer=c),
            dataset.to_list(),
            "id",
            count=3,
        )


def test_from_hf_saves_and_restores_its_state(dataset):
    check_node_resume(
        lambda: HFDatasetReader(dataset=dataset.select(range(20)), chunk_rows=3, seed=1, consumer=Consumer())
    )


@pytest.fixture
def stream(dataset):
    return dataset.to_iterable_dataset(num_shards=4)


def test_from_hf_works_on_an_iterable_dataset(stream, dataset):
    [batches] = epoch_batches(HFIterableReader(dataset=stream, chunk_rows=4, consumer=Consumer()))
    assert rows(batches) == dataset.to_list()
    assert {b.num_rows for b in batches[:-1]} == {4}
    [picked] = epoch_batches(HFIterableReader(dataset=stream, columns=["text"], chunk_rows=50, consumer=Consumer()))
    assert rows(picked) == [{"text": t} for t in dataset["text"]]


def test_from_hf_splits_an_iterable_dataset_between_consumers(stream, dataset):
    # 2 consumers: 2 shards each; 5 consumers: more than the 4 shards, so every 5th batch each
    for count in (2, 5):
        check_split(
            lambda c: HFIterableReader(dataset=stream, chunk_rows=3, consumer=c), dataset.to_list(), "id", count
        )


def test_from_hf_sets_the_epoch_of_an_iterable_dataset(stream):
    shuffled = stream.shuffle(seed=4, buffer_size=10)
    first, second = epoch_batches(HFIterableReader(dataset=shuffled, chunk_rows=5, consumer=Consumer()), epochs=2)
    assert sorted(ids(first)) == list(range(45)) == sorted(ids(second))
    assert ids(first) != ids(second)
    assert ids(epoch_batches(HFIterableReader(dataset=shuffled, chunk_rows=5, consumer=Consumer()))[0]) == ids(first)
    assert shuffled.epoch == 0  # the user's dataset is left alone


def test_from_hf_saves_and_restores_the_state_of_an_iterable_dataset(stream):
    check_node_resume(lambda: HFIterableReader(dataset=stream, chunk_rows=4, consumer=Consumer()))
    check_node_resume(
        lambda: HFIterableReader(dataset=stream, chunk_rows=4, consumer=Consumer(worker=1, num_workers=5)), min_items=1
    )

    def rows_of(shards):
        for i in (i for shard in shards for i in range(shard * 10, shard * 10 + 7)):
            yield {"id": i, "text": str(i)}

    generated = datasets.IterableDataset.from_generator(rows_of, gen_kwargs={"shards": [0, 1, 2]})
    check_node_resume(
        lambda: HFIterableReader(dataset=generated, chunk_rows=4, consumer=Consumer(worker=1, num_workers=2))
    )


def test_from_hf_raises_error_when_given_a_dataset_dict(dataset, stream):
    with pytest.raises(
        ValueError,
        match=r"^`dataset` must be one split, but is a DatasetDict with splits \['train', 'test'\]; pass dataset\['train'\] instead\.$",
    ):
        hf_reader(datasets.DatasetDict({"train": dataset, "test": dataset}), columns=None)
    with pytest.raises(
        ValueError, match=r"^`dataset` must be one split, but is a IterableDatasetDict with splits \['validation'\]"
    ):
        pp.from_hf(datasets.IterableDatasetDict({"validation": stream}))


def test_from_hf_raises_error_when_given_something_else_or_a_missing_column(dataset, stream):
    with pytest.raises(
        TypeError, match=r"^`dataset` must be a datasets.Dataset or datasets.IterableDataset, but is a list instead\.$"
    ):
        hf_reader([{"text": "a"}], columns=None)
    for ds, label in [(dataset, "Dataset"), (stream, "IterableDataset")]:
        with pytest.raises(
            DataError, match=rf"^<datasets\.{label}>: no column 'txt'; available columns: \['id', 'text', 'label'\]\.$"
        ):
            pp.from_hf(ds, columns=["txt"])


def test_from_hf_loader_yields_record_batches(dataset, stream):
    for ds in (dataset, stream):
        batches = list(pp.from_hf(ds, columns=["id"], chunk_rows=10).loader())
        assert all(isinstance(b, pa.RecordBatch) for b in batches)
        assert ids(batches) == list(range(45))
