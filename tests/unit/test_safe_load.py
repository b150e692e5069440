"""A checkpoint from elsewhere runs no code on resume, and its RNG states come back or the resume
stops. Here: the loader's checks, on single files."""

from __future__ import annotations

import pickle

import pytest

from accel_mnist.errors import UsageError
from accel_mnist.run.safe_load import load_file, read_checkpoint_files
from tests.helpers import Planted, plant


def test_bare_pickle_of_a_newer_protocol_is_refused(tmp_path):
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps({"state": Planted(tmp_path / "marker")}, protocol=4))
    with pytest.raises(UsageError, match=r"x.pkl: corrupt, or not loadable without unpickling .*\(Unsupported"):
        load_file(path, [])
    assert not (tmp_path / "marker").exists()


def test_load_file_names_the_refused_global(tmp_path):
    path = tmp_path / "x.pt"
    plant(path, tmp_path / "marker")
    with pytest.raises(UsageError, match=r"x.pt: holds a pickled (builtins|io)\.open"):
        load_file(path, [])
    assert not (tmp_path / "marker").exists()


def test_planted_fsdp_metadata_is_refused_before_any_load(tmp_path):
    # torch.distributed.checkpoint reads .metadata with plain pickle.load, so a resume of an
    # FSDP sharded checkpoint checks it with the allow-list unpickler first.
    shards = tmp_path / "pytorch_model_fsdp_0"
    shards.mkdir()
    plant(shards / ".metadata", tmp_path / "marker", bare=True)
    with pytest.raises(UsageError, match=r"\.metadata: holds a pickled (builtins|io)\.open"):
        read_checkpoint_files(tmp_path, 0, trust=False)
    assert not (tmp_path / "marker").exists()


def test_read_checkpoint_files_reports_a_missing_rng_file(tmp_path):
    with pytest.raises(UsageError, match="random_states_3.pkl: missing"):
        read_checkpoint_files(tmp_path, 3, trust=False)
