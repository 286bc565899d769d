"""mlpjit.errors: fields, the ValueError compatibility of UsageError, and pickling (in this
process and back from a spawned worker process, as `mlpjit warm --jobs` gets them)."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from mlpjit import errors
from mlpjit.errors import (
    CacheDirError,
    CaptureError,
    CompilerUnavailableError,
    CorruptEntryError,
    MissingDependencyError,
    MlpjitError,
    UsageError,
)

CLASSES = [getattr(errors, name) for name in errors.__all__]
FIELDS = {"argument": "--tp", "value": "7", "path": "/tmp/x", "key": "ab" * 32}


def _raise(cls: type[MlpjitError]) -> None:
    raise cls("it broke", **FIELDS)


def test_every_class_is_listed_and_an_mlpjit_error() -> None:
    assert set(CLASSES) == {
        MlpjitError,
        UsageError,
        CacheDirError,
        CompilerUnavailableError,
        CaptureError,
        CorruptEntryError,
        MissingDependencyError,
    }
    assert all(issubclass(cls, MlpjitError) for cls in CLASSES)


def test_fields_are_kept_and_only_set_ones_listed() -> None:
    err = UsageError("tp must divide 12288, got 7", argument="--tp", value=7)
    assert str(err) == "tp must divide 12288, got 7" and err.args == (str(err),)
    assert err.fields() == {"argument": "--tp", "value": 7}
    assert MlpjitError("plain").fields() == {}
    assert CacheDirError("x", path=__import__("pathlib").Path("/a")).path == "/a"


def test_usage_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="bad"):
        raise UsageError("bad", argument="--x")
    assert not issubclass(CacheDirError, ValueError)
    assert issubclass(MissingDependencyError, ImportError)


@pytest.mark.parametrize("cls", CLASSES)
def test_pickles_with_its_fields(cls: type[MlpjitError]) -> None:
    back = pickle.loads(pickle.dumps(cls("it broke", **FIELDS)))
    assert type(back) is cls and str(back) == "it broke" and back.fields() == FIELDS


@pytest.mark.slow
def test_reaches_the_parent_from_a_spawned_worker() -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        for cls in (UsageError, CompilerUnavailableError, MissingDependencyError):
            with pytest.raises(cls) as raised:
                pool.submit(_raise, cls).result()
            assert str(raised.value) == "it broke" and raised.value.fields() == FIELDS
