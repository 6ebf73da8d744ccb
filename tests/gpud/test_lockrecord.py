"""``perseus_gpud.lockrecord``: the clocks and floors the daemon may have left set, on disk.

A daemon killed at any moment finds in the record every GPU it may have left locked or floored;
a file that is not a record is refused with a message naming it, never guessed at.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus_gpud.lockrecord import LockRecord, LockRecordError


def test_a_missing_record_is_empty_and_written_on_the_first_lock(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    record = LockRecord(path)
    assert record.locked() == {} and record.floors() == {}
    assert not path.exists()  # nothing written until there is something to remember
    record.set("GPU-a", 1005)
    assert json.loads(path.read_text()) == {"version": 1, "locked": {"GPU-a": 1005}}


def test_the_first_lock_of_a_lease_is_kept_and_forget_drops_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    record = LockRecord(path)
    record.set("GPU-a", 1005)
    record.set("GPU-a", 1410)  # a later clock of the same lease writes nothing
    record.set("GPU-b", 900)
    assert LockRecord(path).locked() == {"GPU-a": 1005, "GPU-b": 900}  # a new daemon reads it
    record.forget("GPU-a")
    record.forget("GPU-unknown")  # not there: nothing happens
    assert LockRecord(path).locked() == {"GPU-b": 900}


def test_floors_are_recorded_beside_the_locks_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    record = LockRecord(path)
    record.set_floor("GPU-a", 250)
    record.set_floor("GPU-a", 300)  # the first floor of the lease is what is recorded
    doc = json.loads(path.read_text())
    assert doc == {"version": 1, "locked": {}, "floors": {"GPU-a": 250.0}}
    assert LockRecord(path).floors() == {"GPU-a": 250.0}
    record.forget_floor("GPU-a")
    assert "floors" not in json.loads(path.read_text())  # as an older daemon wrote it


def test_an_older_daemons_record_without_floors_is_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"version": 1, "locked": {"GPU-a": 1200}}')
    record = LockRecord(path)
    assert record.locked() == {"GPU-a": 1200} and record.floors() == {}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{oops", "not JSON"),
        ("[]", "not a lock record"),
        ('{"version": 2, "locked": {}}', "not a lock record"),
        ('{"version": 1, "locked": {"GPU-a": true}}', "not a lock record"),
        ('{"version": 1, "locked": {"GPU-a": "1005"}}', "not a lock record"),
        ('{"version": 1, "locked": {}, "floors": {"GPU-a": "250"}}', '"floors" is not'),
        ('{"version": 1, "locked": {}, "floors": []}', '"floors" is not'),
    ],
)
def test_a_file_that_is_not_a_record_is_refused_naming_it(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "state.json"
    path.write_text(content)
    with pytest.raises(LockRecordError, match=expected) as info:
        LockRecord(path)
    assert str(path) in str(info.value)
    assert path.read_text() == content  # never overwritten


def test_a_record_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(LockRecordError, match="cannot read it"):
        LockRecord(path)
