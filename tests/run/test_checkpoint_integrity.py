"""Checksums of checkpoint arrays, data-iterator state and metadata, verified at restore. The
checksum itself: test_checksums.py."""

import json
import logging
import shutil
import sys
import time

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorstore as ts
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.data.sharded_batches import ShardedBatches
from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.checksums import ChecksumError
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training.state import TrainState


def make_state(seed):
    """A small train state with random parameters and Adam moments (several dtypes)."""
    rng = np.random.default_rng(seed)
    params = {
        "dense": {"kernel": rng.standard_normal((128, 192), np.float32), "bias": rng.standard_normal(192, np.float32)},
        "embedding": jnp.asarray(rng.standard_normal((128, 48), np.float32), jnp.bfloat16),
        "scale": rng.standard_normal((8,), np.float32),
    }
    params = jax.tree.map(jnp.asarray, params)
    optimizer = optax.adam(1e-3)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    _, opt_state = optimizer.update(grads, optimizer.init(params), params)
    return TrainState(step=jnp.int32(seed), params=params, opt_state=opt_state, rng=jax.random.PRNGKey(seed))


def make_iterator():
    dataset = grain.MapDataset.range(1000).shuffle(seed=3).map(lambda i: {"x": np.int32(i)}).batch(4).to_iter_dataset()
    return ShardedBatches([iter(dataset)])


def sharded_abstract(state):
    """The state's shapes and dtypes, the first axis of each array sharded over the 8 CPU devices where it divides."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))

    def spec(leaf):
        sharded = leaf.ndim >= 1 and leaf.shape[0] % 8 == 0
        sharding = NamedSharding(mesh, PartitionSpec("x") if sharded else PartitionSpec())
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree.map(spec, state)


METADATA = CheckpointMetadata(
    config={"seed": 1, "rate": 0.1}, model={"d_model": 48}, tokenizer=b"\0\0\0", data_fingerprint=None, step=0
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Steps 1 and 2 of a run, with the data iterator advanced before each save."""
    directory = tmp_path_factory.mktemp("integrity") / "checkpoints"
    checkpointer = Checkpointer(directory, keep=None)
    iterator = make_iterator()
    batches = {}
    for step in (1, 2):
        for _ in range(3):
            next(iterator)
        checkpointer.save(step, make_state(step), iterator, METADATA.replace(step=step))
        batches[step] = next(make_copy(iterator))["x"]
    checkpointer.close()
    return directory, batches


def make_copy(iterator):
    fresh = make_iterator()
    fresh.set_state(iterator.get_state())
    return fresh


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def array_chunks(step_directory):
    """(file, start, end) of each array chunk that the checkpoint's state reads from a data file:
    the indirect values of the newest version of its OCDBT b-tree, as tensorstore's own `dump`
    lists them (small chunks live inside the tree's nodes instead). How orbax spreads the chunks
    and the tree's nodes over files varies from save to save, and files also hold bytes that only
    replaced versions of the tree point at."""
    state = step_directory / "state"
    base = ts.KvStore.open(f"file://{state}/").result()
    pending = [ts.ocdbt.dump(base).result()["versions"][-1]["root"]["location"]]
    chunks = []
    while pending:
        for entry in ts.ocdbt.dump(base, pending.pop()).result()["entries"]:
            for value in entry.values():
                if isinstance(value, str) and value.startswith("btreenode:"):
                    pending.append(value)
                elif isinstance(value, str) and value.startswith("value:"):  # value:<dir>:<file>:<offset>:<length>
                    _, directory, name, offset, length = value.split(":")
                    chunks.append((state / directory / name, int(offset), int(offset) + int(length)))
    return chunks


def zstd_blocks(data):
    """(start, end) of the block contents of the zstd frames that `data` holds one after the other
    (a chunk is one frame: compressed or stored blocks)."""
    blocks, position = [], 0
    while data[position : position + 4] == ZSTD_MAGIC:
        descriptor = data[position + 4]
        single_segment = (descriptor >> 5) & 1
        position += 5 + (1 - single_segment) + (0, 1, 2, 4)[descriptor & 3] + (single_segment, 2, 4, 8)[descriptor >> 6]
        last = False
        while not last:
            header = int.from_bytes(data[position : position + 3], "little")
            last, kind, size = header & 1, (header >> 1) & 3, header >> 3
            position += 3
            length = 1 if kind == 1 else size  # an RLE block holds its one repeated byte
            blocks.append((position, position + length))
            position += length
        position += 4 * ((descriptor >> 2) & 1)  # content checksum (orbax writes none)
    assert position == len(data), "a chunk that is not whole zstd frames"
    return blocks


def flip_bit(step_directory, fraction, bit=3):
    """Flips one bit at `fraction` of the checkpoint's array chunk block bytes taken end to end."""
    spans = []
    for path, chunk_start, chunk_end in array_chunks(step_directory):
        chunk = path.read_bytes()[chunk_start:chunk_end]
        spans += [(path, chunk_start + start, chunk_start + end) for start, end in zstd_blocks(chunk)]
    total = sum(end - start for _, start, end in spans)
    assert total > 50_000
    position = int(total * fraction)
    for path, start, end in spans:  # noqa: B007  (path is used after the loop)
        if position < end - start:
            break
        position -= end - start
    data = bytearray(path.read_bytes())
    data[start + position] ^= 1 << bit
    path.write_bytes(bytes(data))


FLIPS = [0.1, 0.3, 0.5, 0.7, 0.9]


# ------------------------------------------------------------------------------------------
# Save and restore.
# ------------------------------------------------------------------------------------------


def test_save_records_checksums_beside_the_metadata(tmp_path):
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=None)
    state = make_state(1)
    checkpointer.save(1, state, make_iterator(), METADATA.replace(step=1))
    checkpointer.save_params(2, state.params, METADATA.replace(step=2, bleu=12.5))
    with pytest.raises(ValueError, match="saving step 3 with the metadata of step 2"):
        checkpointer.save_params(3, state.params, METADATA.replace(step=2))
    checkpointer.close()
    reader = Checkpointer(tmp_path / "checkpoints", keep=None, read_only=True)
    for step, first in ((1, "opt_state/0/mu/dense/kernel"), (2, "params/dense/kernel")):
        written = json.loads(reader.metadata_file(step).read_text())
        checksums = written.pop("checksums")
        assert first in checksums["arrays"] and "params/embedding" in checksums["arrays"]
        assert ("data_iterator" in checksums) == (step == 1)
        expected = METADATA.replace(step=step, bleu=12.5 if step == 2 else None)
        assert written == expected.to_json() and written["tokenizer"] == "AAAA"  # base64 in the file
        assert reader.read_metadata(step) == expected
    reader.close()


def test_a_params_checkpoint_saved_again_sets_the_previous_aside_as_replaced_not_damaged(tmp_path, caplog):
    # average_checkpoints --last N run twice writes averaged/<same newest step> twice: the first
    # is kept beside the new one, named and logged as replaced (it is not damaged), even twice a second.
    directory = tmp_path / "averaged"
    checkpointer = Checkpointer(directory, keep=1)
    first, second, third = (make_state(seed).params for seed in (1, 2, 3))
    checkpointer.save_params(7, first, METADATA.replace(step=7))
    with caplog.at_level(logging.WARNING):
        checkpointer.save_params(7, second, METADATA.replace(step=7))
        checkpointer.save_params(7, third, METADATA.replace(step=7))
    assert checkpointer.steps() == [7]
    checkpointer.close()
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("moved ")]
    assert len(messages) == 2 and all("previous checkpoint" in m and "damaged" not in m for m in messages)
    aside = sorted(directory.glob("7.replaced-*"))
    assert len(aside) == 2 and not list(directory.glob("7.damaged-*"))
    reader = Checkpointer(directory, keep=None, read_only=True)
    latest = reader.restore_params(7)
    reader.close()
    for leaf, expected in zip(jax.tree.leaves(latest), jax.tree.leaves(third)):
        np.testing.assert_array_equal(leaf, expected)
    for index, (path, expected) in enumerate(zip(aside, (first, second))):  # set aside in order, intact
        shutil.copytree(path, tmp_path / f"copy{index}" / "7")
        copy = Checkpointer(tmp_path / f"copy{index}", keep=None, read_only=True)
        for leaf, value in zip(jax.tree.leaves(copy.restore_params(7)), jax.tree.leaves(expected)):
            np.testing.assert_array_equal(leaf, value)
        copy.close()
    writer = Checkpointer(directory, keep=1)
    with pytest.raises(ValueError, match="reason must be one of"):
        writer.set_aside(7, reason="old")
    writer.close()


@pytest.mark.parametrize("kind", ["file", "link to nothing"])
def test_a_train_state_saved_where_something_else_lies_sets_it_aside(kind, tmp_path, caplog):
    # Orbax lists no such entry among its steps, and its forced save deleted it without a word.
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    mine = directory / "3"
    mine.write_text("junk\n") if kind == "file" else mine.symlink_to(tmp_path / "nowhere")
    checkpointer = Checkpointer(directory, keep=None)
    with caplog.at_level(logging.WARNING):
        checkpointer.save(3, make_state(3), make_iterator(), METADATA.replace(step=3))
        checkpointer.wait()
    assert checkpointer.steps() == [3]
    checkpointer.close()
    (aside,) = directory.glob("3.damaged-*")
    assert aside.is_symlink() if kind != "file" else aside.read_text() == "junk\n"
    assert any(r.getMessage().startswith("moved the damaged checkpoint of step 3 to ") for r in caplog.records)


def test_restore_verifies_and_resumes_the_data_iterator(saved, tmp_path, caplog):
    directory, batches = saved
    checkpointer = Checkpointer(shutil.copytree(directory, tmp_path / "checkpoints"), keep=None)
    iterator = make_iterator()
    with caplog.at_level(logging.WARNING):
        step, state, _ = checkpointer.restore_latest(sharded_abstract(make_state(0)), iterator)
    assert step == 2 and not [record for record in caplog.records if record.levelno >= logging.WARNING]
    expected = make_state(2)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert state.params["dense"]["kernel"].sharding.spec == PartitionSpec("x")
    np.testing.assert_array_equal(next(iterator)["x"], batches[2])
    params = checkpointer.restore_params(2, sharded_abstract(make_state(0)).params)
    np.testing.assert_array_equal(np.asarray(params["embedding"]), np.asarray(expected.params["embedding"]))
    checkpointer.close()


@pytest.mark.parametrize("fraction", FLIPS)
def test_a_flipped_bit_in_array_data_is_a_damaged_checkpoint(saved, tmp_path, caplog, fraction):
    directory, batches = saved
    directory = shutil.copytree(directory, tmp_path / "checkpoints")
    original = Checkpointer(directory, keep=None).restore_params(2)
    flip_bit(directory / "2", fraction)

    checkpointer = Checkpointer(directory, keep=None)
    try:
        params = checkpointer.restore_params(2)
    except CheckpointError as error:
        assert str(directory / "2") in str(error) and "\n" not in str(error)
        if isinstance(error, ChecksumError):
            assert "array params/" in str(error)
    else:  # the flip hit the optimizer state, which restore_params does not read
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(original)):
            np.testing.assert_array_equal(a, b)

    iterator = make_iterator()
    with caplog.at_level(logging.WARNING):
        step, _, _ = checkpointer.restore_latest(sharded_abstract(make_state(0)), iterator)
    checkpointer.close()
    assert step == 1
    assert any("checkpoint" in r.getMessage() and "/2 cannot be restored" in r.getMessage() for r in caplog.records)
    assert checkpointer.steps() == [1]
    assert [p.name.split(".")[0] for p in directory.glob("2.damaged-*")] == ["2"]
    np.testing.assert_array_equal(next(iterator)["x"], batches[1])


def test_flipped_bits_in_parameters_only_checkpoints_name_the_array(tmp_path):
    directory = tmp_path / "params"
    checkpointer = Checkpointer(directory, keep=None)
    checkpointer.save_params(5, make_state(5).params, METADATA.replace(step=5))
    checkpointer.close()
    checksum_errors = 0
    for index, fraction in enumerate(FLIPS):
        copy_directory = shutil.copytree(directory, tmp_path / f"copy{index}")
        flip_bit(copy_directory / "5", fraction)
        reader = Checkpointer(copy_directory, keep=None)
        with pytest.raises(CheckpointError, match=str(copy_directory / "5")) as raised:
            reader.restore_params(5)
        reader.close()
        if isinstance(raised.value, ChecksumError):
            assert "array params/" in str(raised.value) and "does not match its checksum" in str(raised.value)
            checksum_errors += 1
    assert checksum_errors >= 3  # most flips pass orbax and zstd unnoticed: the checksum catches them


def test_a_changed_data_iterator_state_is_a_damaged_checkpoint(saved, tmp_path, caplog):
    directory, batches = saved
    directory = shutil.copytree(directory, tmp_path / "checkpoints")
    (state_file,) = (directory / "2" / "data").glob("process_*.json")
    state = json.loads(state_file.read_text())
    inner = json.loads(state[0]) if isinstance(state[0], str) else state[0]
    key = next(k for k, v in inner.items() if isinstance(v, int) and v > 0)
    inner[key] += 1
    state[0] = json.dumps(inner) if isinstance(state[0], str) else inner
    state_file.write_text(json.dumps(state))
    checkpointer = Checkpointer(directory, keep=None)
    with caplog.at_level(logging.WARNING):
        step, _, _ = checkpointer.restore_latest(sharded_abstract(make_state(0)), make_iterator())
    checkpointer.close()
    assert step == 1
    assert any("data iterator state" in r.getMessage() for r in caplog.records)


def test_changed_metadata_is_a_damaged_checkpoint(saved, tmp_path, caplog):
    directory, _ = saved
    directory = shutil.copytree(directory, tmp_path / "checkpoints")
    path = directory / "2" / "metadata" / "metadata"
    path.write_text(path.read_text().replace('"rate": 0.1', '"rate": 0.3'))
    checkpointer = Checkpointer(directory, keep=None)
    with pytest.raises(ChecksumError, match=f"{path} is damaged"):
        checkpointer.read_metadata(2)
    assert checkpointer.latest_metadata().step == 1
    with caplog.at_level(logging.WARNING):
        step, _, _ = checkpointer.restore_latest(sharded_abstract(make_state(0)), make_iterator())
    checkpointer.close()
    assert step == 1


def test_checkpoints_without_checksums_restore_with_a_warning(saved, tmp_path, caplog):
    directory, batches = saved
    directory = shutil.copytree(directory, tmp_path / "checkpoints")
    path = directory / "2" / "metadata" / "metadata"
    metadata = json.loads(path.read_text())
    del metadata["checksums"]
    path.write_text(json.dumps(metadata))
    checkpointer = Checkpointer(directory, keep=None)
    iterator = make_iterator()
    with caplog.at_level(logging.WARNING):
        step, state, _ = checkpointer.restore_latest(sharded_abstract(make_state(0)), iterator)
    assert step == 2
    unverified = [r.getMessage() for r in caplog.records if "no checksums" in r.getMessage()]
    assert len(unverified) == 1 and str(directory / "2") in unverified[0]
    np.testing.assert_array_equal(next(iterator)["x"], batches[2])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        checkpointer.restore_params(2)
    checkpointer.close()
    assert len([r for r in caplog.records if "no checksums" in r.getMessage()]) == 1


def test_a_failed_restore_leaves_no_event_loop_errors(tmp_path, capfd, monkeypatch):
    """A read that fails while others are in flight used to print dozens of tracebacks of
    "RuntimeError: Event loop is closed" after the error (orbax closes its loop at once; the
    reads still running report to it from tensorstore's threads, through sys.unraisablehook)."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: unraisable.append(repr(report.exc_value)))
    rng = np.random.default_rng(0)
    params = {f"layer_{i}": jnp.asarray(rng.standard_normal((32, 64), np.float32)) for i in range(100)}
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=None)
    checkpointer.save_params(1, params, METADATA.replace(step=1))
    checkpointer.close()
    for path in {path for path, _, _ in array_chunks(tmp_path / "checkpoints" / "1")}:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=None)
    for _ in range(3):  # how many reads are still in flight at the failure varies
        with pytest.raises(CheckpointError, match="cannot restore the parameters"):
            checkpointer.restore_params(1)
    checkpointer.close()
    time.sleep(0.5)  # reads left running would report to the closed event loop by now
    assert not unraisable
    assert "Event loop is closed" not in "".join(capfd.readouterr())


def test_a_step_removed_while_it_is_read_is_named_as_removed_not_damaged(tmp_path, monkeypatch):
    """A run training in the workdir deletes its oldest checkpoint as a reader (averaging, say)
    goes through it: the metadata read, the folder gone before the arrays are."""
    writer = Checkpointer(tmp_path / "checkpoints", keep=None)
    writer.save_params(3, make_state(3).params, METADATA.replace(step=3))
    writer.close()
    reader = Checkpointer(tmp_path / "checkpoints", keep=None, read_only=True)
    read_json = Checkpointer._read_json

    def read_then_removed(self, step):
        values = read_json(self, step)
        shutil.rmtree(tmp_path / "checkpoints" / str(step))
        return values

    monkeypatch.setattr(Checkpointer, "_read_json", read_then_removed)
    with pytest.raises(CheckpointError, match=r"checkpoint .*/3 was removed while it was read") as error:
        reader.restore_params(3)
    assert "damaged" not in str(error.value)
    reader.close()
