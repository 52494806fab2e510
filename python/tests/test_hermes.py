"""The Hermes Agent memory provider's setup flow, without Hermes (tests/e2e/hosts.rs drives it
inside Hermes): what `hermes memory setup abridge` asks, writes and reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abridge_memory import AbridgeError
from abridge_memory.hermes import AbridgeMemoryProvider, install, load_config, session_of


def test_setup_writes_its_settings_and_reads_them_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABRIDGE_HERMES_URL", raising=False)
    p = AbridgeMemoryProvider()
    keys = [f["key"] for f in p.get_config_schema()]
    assert keys == ["url", "token", "binary", "model_url", "user", "budget"]
    token = next(f for f in p.get_config_schema() if f["key"] == "token")
    assert token["secret"] and token["env_var"] == "ABRIDGE_HERMES_TOKEN"
    # Secrets never go into the file (Hermes keeps them in its .env).
    p.save_config({"url": "http://127.0.0.1:8787", "token": "s3cret", "budget": 900}, str(tmp_path))
    saved = json.loads((tmp_path / "abridge.json").read_text())
    assert saved == {"budget": 900, "url": "http://127.0.0.1:8787"}
    cfg = load_config(str(tmp_path))
    assert cfg["url"] == "http://127.0.0.1:8787" and cfg["budget"] == 900 and cfg["user"] == "hermes"
    monkeypatch.setenv("ABRIDGE_HERMES_TOKEN", "s3cret")
    assert load_config(str(tmp_path))["token"] == "s3cret"


def test_bad_settings_say_what_to_fix(tmp_path: Path) -> None:
    (tmp_path / "abridge.json").write_text("{not json")
    with pytest.raises(AbridgeError, match="abridge.json is not valid JSON"):
        load_config(str(tmp_path))
    (tmp_path / "abridge.json").write_text(json.dumps({"budget": "lots"}))
    with pytest.raises(AbridgeError, match="budget is 'lots', not a number"):
        load_config(str(tmp_path))


def test_install_writes_the_folder_hermes_discovers(tmp_path: Path) -> None:
    folder = install(str(tmp_path))
    assert folder == tmp_path / "plugins" / "abridge"
    text = (folder / "__init__.py").read_text()
    # Hermes counts a user plugin folder only when its __init__ mentions one of these.
    assert "register_memory_provider" in text and "MemoryProvider" in text
    assert "name: abridge" in (folder / "plugin.yaml").read_text()


def test_a_hermes_session_id_is_an_abridge_session_id() -> None:
    assert session_of("20261130_160232_d838") == "hermes-20261130_160232_d838"
    odd = session_of("chat with spaces/and slashes")
    assert odd.startswith("hermes-") and " " not in odd and "/" not in odd
    assert odd == session_of("chat with spaces/and slashes")
