"""Files read again when they change (scaler/runtime/reload.py): what changed is made again and used, in one line; what
cannot be used yet is said once and the one before kept."""

import logging
from pathlib import Path

import pytest

from scaler.gateway import admin_key
from scaler.runtime import reload
from scaler.runtime.tls import CannotRead, ServerTls
from tests.certs import Authority


def made(path) -> list[str]:
    text = path.read_text()
    if not text.endswith("\n"):  # stands for a check a half-written file fails
        raise CannotRead(f"{path}: half-written")
    return text.split()


def test_a_change_is_made_again_said_once_and_told_to_each_user(tmp_path, caplog):
    caplog.set_level(logging.INFO, "scaler.reload")
    path = tmp_path / "file"
    path.write_text("a\n")
    watched = reload.Watched("the file", [str(path)], lambda: made(path))
    told: list[list[str]] = []
    gone: list[list[str]] = []
    watched.use(told.append, lambda: True)
    watched.use(gone.append, lambda: False)  # a user gone: told nothing
    fetch = watched.fetcher()
    assert watched.value == ["a"] and not watched.look() and fetch() is None  # nothing changed

    path.write_text("a b")  # half-written: kept, said once however often looked at
    assert not watched.look() and not watched.look()
    assert watched.value == ["a"] and told == [] and fetch() is None
    path.write_text("a b\n")
    assert watched.look() and not watched.look()
    assert watched.value == ["a", "b"] and told == [["a", "b"]] and gone == []
    assert fetch() == ["a", "b"] and fetch() is None  # gRPC's fetcher: the new one once
    path.write_text("a b\n")  # written again, the same: no change
    assert not watched.look()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the file changed, but cannot be used") and "half-written" in lines[0]
    assert lines[1] == f"reloaded the file ({path})"


def test_a_listener_keeps_its_pair_until_the_new_certificate_and_key_match(tmp_path):
    old, new = Authority(tmp_path / "old"), Authority(tmp_path / "new")
    first, second = old.issue("server"), new.issue("server-new")
    live = tmp_path / "live.pem", tmp_path / "live.key"
    live[0].write_bytes(Path(first.cert).read_bytes())
    live[1].write_bytes(Path(first.key).read_bytes())
    tls = ServerTls(str(live[0]), str(live[1]))
    watched = reload.Watched("TLS", [str(p) for p in live], tls.check)
    fetch = watched.fetcher()
    live[0].write_bytes(Path(second.cert).read_bytes())
    assert not watched.look() and fetch() is None  # the new certificate, the old key: not a pair
    live[1].write_bytes(Path(second.key).read_bytes())
    assert watched.look() and fetch() is not None
    with pytest.raises(CannotRead, match=r"--tls-client-ca .*: not a CA certificate"):
        ServerTls(str(live[0]), str(live[1]), str(live[1])).check()  # a key where the CA should be


def test_the_admin_key_file_may_hold_several_keys_a_client_sends_the_first(tmp_path):
    path = tmp_path / "key"
    path.write_text("new\n\n  old  \n")
    assert admin_key.keys(str(path)) == (b"new", b"old")
    assert admin_key.load(str(path)) == b"new"


def test_files_whose_users_are_all_gone_are_no_more_looked_at(tmp_path):
    path = tmp_path / "file"
    path.write_text("a\n")
    watched = reload.Watched("the file", [str(path)], lambda: made(path))
    users = [True]
    watched.use(lambda value: None, lambda: users[0])
    path.write_text("b\n")
    assert watched.look() and not watched.abandoned
    users[0] = False
    assert not watched.in_use() and watched.abandoned
    path.write_text("c\n")
    assert reload.look() == 0 and watched.value == ["b"]  # no more looked at
    assert watched.look() and watched.value == ["c"]  # but made anew when asked for (a new connection's)
