"""Errors are Python exceptions with a class per error kind, ``retryable`` from the error's
retry class, and no secret in the message."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import pytest

import sluice
from sluice import _sluice


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_classes_form_one_hierarchy():
    for cls in (
        sluice.ConfigError,
        sluice.SourceError,
        sluice.DestinationError,
        sluice.DataError,
        sluice.Interrupted,
        sluice.InternalError,
    ):
        assert issubclass(cls, sluice.SluiceError)
    assert issubclass(sluice.SluiceError, Exception)


def test_config_errors(pg):
    with pytest.raises(sluice.ConfigError) as e:
        sluice.read_arrow(pg.url, table="no_such_table")
    assert e.value.retryable is False
    assert e.value.kind == "config"
    assert "no_such_table" in str(e.value)

    # The options are the CLI's: its checks and messages, unknown names refused.
    with pytest.raises(sluice.ConfigError, match="memory"):
        sluice.read_arrow(pg.url, table="t", memory="1MB")
    # A value that does not parse names its keyword.
    with pytest.raises(sluice.ConfigError, match="batch_size: .*lots"):
        sluice.read_arrow(pg.url, table="t", batch_size="lots")
    with pytest.raises(sluice.ConfigError, match="bogus"):
        _sluice.read(source=pg.url, table="t", bogus=1)
    with pytest.raises(sluice.ConfigError, match="chunk-by"):
        sluice.read_arrow(pg.url, table="t", chunk_by="rows")
    with pytest.raises(sluice.ConfigError, match="exactly one"):
        sluice.read_arrow(pg.url)
    # Settings about files are refused for a read, not ignored.
    with pytest.raises(sluice.ConfigError, match="compression"):
        _sluice.read(source=pg.url, table="t", compression="snappy")
    with pytest.raises(sluice.ConfigError, match="unsupported scheme"):
        sluice.read_arrow("oracle://u@h/db", table="t")
    # A keyword the function does not have is Python's TypeError, before anything runs.
    with pytest.raises(TypeError):
        sluice.read_arrow(pg.url, table="t", to="/tmp/x")  # type: ignore[call-arg]


def test_source_errors_are_redacted_and_say_whether_to_retry(pg):
    # Nothing listens on the port: a connection failure, worth retrying.
    url = f"postgres://app:s3cret-pw@127.0.0.1:{free_port()}/db"
    with pytest.raises(sluice.SourceError) as e:
        sluice.read_arrow(url, table="t")
    assert e.value.retryable is True
    assert "s3cret-pw" not in str(e.value)

    # A wrong password: permanent.
    parts = urlsplit(pg.url)
    bad = pg.url.replace(f"{parts.username}@", "nobody:wrong-pw@", 1)
    with pytest.raises(sluice.SourceError) as e:
        sluice.read_arrow(bad, table="t")
    assert e.value.retryable is False
    assert "wrong-pw" not in str(e.value)
    assert "password" in str(e.value)


def test_data_error(pg):
    pg.exec("CREATE TABLE n (id int, v numeric(10,2)); INSERT INTO n VALUES (1, 1.5), (2, 'NaN')")
    with pytest.raises(sluice.DataError) as e:
        sluice.read_arrow(pg.url, table="n")
    assert e.value.retryable is False
    assert "NaN" in str(e.value)
    # The stream raises the same class from the iteration.
    with pytest.raises(sluice.DataError):
        sluice.read_batches(pg.url, table="n").read_all()


def test_destination_error(pg, tmp_path):
    pg.exec("CREATE TABLE t (id int); INSERT INTO t VALUES (1)")
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(sluice.DestinationError) as e:
        sluice.export(pg.url, table="t", to=blocked / "out")
    assert e.value.retryable is False
    assert e.value.kind == "destination"
    assert "Not a directory" in str(e.value)
