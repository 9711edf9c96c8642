"""`manage.py embedded_db` on a data folder where no server runs (a real start is exercised by
bin/run and by every test session without DATABASE_URL)."""

import pytest
from django.core.management import call_command

from project import database


@pytest.fixture
def empty_data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(database, "EMBEDDED_DATA_DIR", tmp_path / "pgdata")
    return tmp_path / "pgdata"


def test_status_of_a_stopped_server_exits_3_without_starting_it(empty_data_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        call_command("embedded_db", "status")
    assert exit_info.value.code == 3
    assert "stopped" in capsys.readouterr().out
    assert not empty_data_dir.exists()


def test_stop_of_a_stopped_server_says_so(empty_data_dir, capsys):
    call_command("embedded_db", "stop")
    assert "was not running" in capsys.readouterr().out
