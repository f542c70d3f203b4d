"""Settings read from ENGRAM_* variables: what an empty or padded value means, and what the
production guard lets through (refusals are in test_cli.py, as the command prints them)."""

import json
import os
from pathlib import Path
from typing import get_args
from uuid import UUID

import platformdirs
import pytest
from pydantic import SecretStr

from app.config import Settings


@pytest.fixture(autouse=True)
def no_engram_settings(monkeypatch):
    for name in [n for n in os.environ if n.startswith("ENGRAM_")]:
        monkeypatch.delenv(name)


def test_an_empty_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv("ENGRAM_DATABASE_URL", "")
    monkeypatch.setenv("ENGRAM_DATA_DIR", "")
    monkeypatch.setenv("ENGRAM_MODEL_ALLOWED_KEY_ENVS", "")
    monkeypatch.setenv("ENGRAM_OTEL_ENDPOINT", "")
    monkeypatch.setenv("ENGRAM_HOST", "")
    settings = Settings()
    assert settings.database_url is None and settings.database_url_value() is None
    assert settings.data_dir == Path(platformdirs.user_data_dir("engram"))
    assert settings.model_allowed_key_envs == []
    assert settings.otel_endpoint is None
    # Not "", which would listen on every interface.
    assert settings.host == "127.0.0.1"


def test_a_word_from_a_fixed_list_may_come_in_any_case(monkeypatch):
    monkeypatch.setenv("ENGRAM_LOG_LEVEL", "debug")
    monkeypatch.setenv("ENGRAM_LOG_FORMAT", "JSON")
    monkeypatch.setenv("ENGRAM_EMBEDDER", "Static")
    settings = Settings()
    assert (settings.log_level, settings.log_format, settings.embedder) == (
        "DEBUG",
        "json",
        "static",
    )
    monkeypatch.setenv("ENGRAM_LOG_LEVEL", "verbose")
    with pytest.raises(ValueError, match="DEBUG"):
        Settings()


def test_the_bootstrap_token_is_stripped(monkeypatch):
    # As read from a secret file, with its newline.
    monkeypatch.setenv("ENGRAM_BOOTSTRAP_TOKEN", "  the-token\n")
    token = Settings().bootstrap_token
    assert token is not None and token.get_secret_value() == "the-token"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_production_on_loopback_may_use_the_embedded_database(monkeypatch, host):
    monkeypatch.setenv("ENGRAM_ENVIRONMENT", "production")
    monkeypatch.setenv("ENGRAM_HOST", host)
    assert Settings().database_url is None


@pytest.mark.parametrize("size", ["", "1MB", "1 GB", "2047GB", "2147483647kB", "1048576"])
def test_index_build_memory_within_postgresqls_range(monkeypatch, size):
    monkeypatch.setenv("ENGRAM_AGENT_INDEX_BUILD_MEMORY", size)
    assert Settings().agent_index_build_memory == size


def test_lists_and_bounds_at_their_limits(monkeypatch):
    monkeypatch.setenv("ENGRAM_MODEL_ALLOWED_BASE_URLS", '["https://team.example/v1"]')
    monkeypatch.setenv("ENGRAM_PORT", "65535")
    monkeypatch.setenv("ENGRAM_POOL_MIN_SIZE", "0")
    monkeypatch.setenv("ENGRAM_MODEL_TIMEOUT_SECONDS", "86400")
    monkeypatch.setenv("ENGRAM_TURN_LEASE_SECONDS", "604800")
    monkeypatch.setenv("ENGRAM_TURN_TIMEOUT_SECONDS", "86400")
    monkeypatch.setenv("ENGRAM_MAX_JSON_DEPTH", "256")
    monkeypatch.setenv("ENGRAM_MODEL_MAX_RETRIES", "10")
    monkeypatch.setenv("ENGRAM_MAX_TOOL_CALLS_PER_REPLY", "1024")
    monkeypatch.setenv("ENGRAM_MODEL_MAX_REPLY_BYTES", "100000000")
    settings = Settings()
    assert settings.model_allowed_base_urls == ["https://team.example/v1"]
    assert (settings.port, settings.pool_min_size, settings.max_json_depth) == (65535, 0, 256)
    assert (settings.model_max_retries, settings.max_tool_calls_per_reply) == (10, 1024)
    assert settings.model_max_reply_bytes == 100_000_000
    assert settings.turn_timeout_seconds == 86400
    monkeypatch.setenv("ENGRAM_TURN_TIMEOUT_SECONDS", "0")  # no bound
    assert Settings().turn_timeout_seconds == 0


def test_admin_events_are_kept_a_year_unless_set(monkeypatch):
    assert Settings().admin_events_retention_days == 365
    for days in ("0", "1", "36500"):
        monkeypatch.setenv("ENGRAM_ADMIN_EVENTS_RETENTION_DAYS", days)
        assert Settings().admin_events_retention_days == int(days)


@pytest.mark.parametrize("days", ["-1", "36501", "1000000000", "1.5", "a year"])
def test_a_retention_beyond_its_range_is_refused_saying_what_it_takes(monkeypatch, days):
    monkeypatch.setenv("ENGRAM_ADMIN_EVENTS_RETENTION_DAYS", days)
    with pytest.raises(ValueError) as refused:
        Settings()
    assert (
        "must be a whole number of days from 1 to 36500 (100 years), or 0 to keep events as long "
        "as their account"
    ) in str(refused.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENGRAM_DATABASE_URL", "mysql://engram:S3CRET-9@db/engram"),
        ("ENGRAM_MODEL_ALLOWED_BASE_URLS", '["ftp://S3CRET-9@host"]'),
        ("ENGRAM_MODEL_ALLOWED_BASE_URLS", '{"ftp://S3CRET-9@host": ["*"]}'),
        # A key pasted where its variable's name belongs.
        ("ENGRAM_MODEL_ALLOWED_KEY_ENVS", '{"sk-S3CRET-9": ["*"]}'),
    ],
)
def test_a_refused_value_is_never_quoted_where_it_could_be_a_secret(monkeypatch, name, value):
    """The refusal names the variable and what it accepts; the value may hold a password."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as refused:
        Settings()
    assert "S3CRET-9" not in str(refused.value)


def test_a_database_url_libpq_cannot_read_is_one_line_without_its_password(capsys, monkeypatch):
    from app import cli

    monkeypatch.setenv("ENGRAM_DATABASE_URL", "postgresql://engram:S3CRET-9@[::1/engram")
    assert cli.main(["migrate"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("engram: ENGRAM_DATABASE_URL cannot be read as a PostgreSQL URL")
    assert "S3CRET-9" not in line


TEAM = "0B2A1F3E-0000-4000-8000-00000000000A"  # as an operator may paste it: upper case
OTHER = "0b2a1f3e-0000-4000-8000-00000000000b"


def test_allow_lists_may_name_the_accounts_of_each_key_and_endpoint(monkeypatch):
    monkeypatch.setenv("ENGRAM_MODEL_BASE_URL", "http://models.internal/v1")
    monkeypatch.setenv(
        "ENGRAM_MODEL_ALLOWED_KEY_ENVS", json.dumps({"TEAM_KEY": [TEAM], "SHARED_KEY": ["*"]})
    )
    monkeypatch.setenv(
        "ENGRAM_MODEL_ALLOWED_BASE_URLS",
        json.dumps({"https://team.example/v1/": [TEAM], "http://models.internal/v1": ["*"]}),
    )
    settings = Settings()
    assert settings.model_allowed_key_envs == {"TEAM_KEY": [TEAM.lower()], "SHARED_KEY": ["*"]}
    team, other = UUID(TEAM), UUID(OTHER)
    assert settings.allows_key_env("TEAM_KEY", team)
    assert not settings.allows_key_env("TEAM_KEY", other)
    assert settings.allows_key_env("SHARED_KEY", other)
    assert not settings.allows_key_env("UNLISTED_KEY", team)
    assert settings.allows_base_url("https://team.example/v1", team)
    assert not settings.allows_base_url("https://team.example/v1", other)
    # The default model's endpoint is every account's, listed or not.
    assert settings.allows_base_url("http://models.internal/v1/", other)


def test_a_list_still_allows_every_account(monkeypatch):
    monkeypatch.setenv("ENGRAM_MODEL_ALLOWED_KEY_ENVS", '["TEAM_KEY"]')
    monkeypatch.setenv("ENGRAM_MODEL_ALLOWED_BASE_URLS", '["https://team.example/v1"]')
    settings = Settings()
    assert settings.model_allowed_key_envs == ["TEAM_KEY"]
    for account in (UUID(TEAM), UUID(OTHER)):
        assert settings.allows_key_env("TEAM_KEY", account)
        assert settings.allows_base_url("https://team.example/v1/", account)
        assert not settings.allows_key_env("OTHER_KEY", account)


@pytest.mark.parametrize(
    ("name", "value", "told"),
    [
        ("KEY_ENVS", '{"TEAM_KEY": ["a"', "must be a JSON list of strings"),
        ("KEY_ENVS", '"TEAM_KEY"', "or a JSON object from each to the accounts"),
        ("KEY_ENVS", '{"TEAM_KEY": ["team-a"]}', "TEAM_KEY: account 0 is not an account ID"),
        ("KEY_ENVS", f'{{"TEAM_KEY": ["*", "{OTHER}", 7]}}', "TEAM_KEY: account 2 is not an"),
        ("KEY_ENVS", '{"TEAM_KEY": "*"}', "TEAM_KEY: must be a list of the account IDs"),
        ("KEY_ENVS", '{"TEAM_KEY": ["*"], " ": ["*"]}', "entry 1 names no variable"),
        ("KEY_ENVS", '{"": ["*"]}', "entry 0 names no variable"),
        ("KEY_ENVS", '{"team-key": ["*"]}', "is not an environment variable name"),
        ("KEY_ENVS", '{"ENGRAM_BOOTSTRAP_TOKEN": ["*"]}', "service's own settings"),
        # A list's items are names as an object's entries are (a list took any string).
        ("KEY_ENVS", '["TEAM_KEY", ""]', "item 1 names no variable"),
        ("KEY_ENVS", '["team-key"]', "item 0 is not an environment variable name"),
        ("KEY_ENVS", '["ENGRAM_MODEL_API_KEY"]', "service's own settings"),
        ("BASE_URLS", '{"": ["*"]}', "entry 0 is not an http:// or https:// URL"),
        ("BASE_URLS", '{"https://team.example/v1": [""]}', "entry 0: account 0 is not an"),
        # The default model is every account's: limiting it would read as limited, and not be.
        ("BASE_URLS", json.dumps({"http://127.0.0.1:11434/v1/": [OTHER]}), "cannot be limited"),
    ],
)
def test_a_wrong_allow_list_is_refused_naming_its_setting(monkeypatch, name, value, told):
    monkeypatch.setenv(f"ENGRAM_MODEL_ALLOWED_{name}", value)
    with pytest.raises(ValueError) as refused:
        Settings()
    assert f"model_allowed_{name.lower()}" in str(refused.value) or (
        f"ENGRAM_MODEL_ALLOWED_{name}" in str(refused.value)
    )
    assert told in str(refused.value), str(refused.value)


@pytest.mark.parametrize(
    ("value", "accepted"),
    [("1048576", True), ("1073741824", True), ("1048575", False), ("1073741825", False)],
)
def test_max_answer_bytes_is_between_1_mib_and_1_gib(monkeypatch, value, accepted):
    """Below 1 MiB one execution's input (a request body) could not be read back; above 1 GiB
    one answer would hold the process's memory for every tenant."""
    monkeypatch.setenv("ENGRAM_MAX_ANSWER_BYTES", value)
    if accepted:
        assert Settings().max_answer_bytes == int(value)
    else:
        with pytest.raises(ValueError, match="max_answer_bytes"):
            Settings()


def test_account_bounds_follow_the_pool_unless_set(monkeypatch):
    def bounds() -> tuple[int, int, int]:
        s = Settings()
        return s.requests_per_account(), s.turns_per_account(), s.connections_per_account()

    assert bounds() == (20, 10, 5)  # of the pool of 10
    monkeypatch.setenv("ENGRAM_POOL_MIN_SIZE", "1")
    monkeypatch.setenv("ENGRAM_POOL_MAX_SIZE", "1")
    assert bounds() == (2, 1, 1)
    monkeypatch.setenv("ENGRAM_MAX_REQUESTS_PER_ACCOUNT", "3")
    monkeypatch.setenv("ENGRAM_MAX_TURNS_PER_ACCOUNT", "2")
    monkeypatch.setenv("ENGRAM_MAX_CONNECTIONS_PER_ACCOUNT", "1")
    assert bounds() == (3, 2, 1)
    monkeypatch.setenv("ENGRAM_ACCOUNT_QUEUE_SECONDS", "0")
    assert Settings().account_queue_seconds == 0


@pytest.mark.parametrize(
    ("name", "value", "told"),
    [
        (
            "MAX_CONNECTIONS_PER_ACCOUNT",
            "11",
            "ENGRAM_MAX_CONNECTIONS_PER_ACCOUNT must not be more than ENGRAM_POOL_MAX_SIZE "
            "(11 > 10): it is each account's share of the pool",
        ),
        ("MAX_CONNECTIONS_PER_ACCOUNT", "0", "greater than or equal to 1"),
        ("MAX_REQUESTS_PER_ACCOUNT", "0", "greater than or equal to 1"),
        ("MAX_REQUESTS_PER_ACCOUNT", "", "a valid integer"),
        ("MAX_TURNS_PER_ACCOUNT", "10001", "less than or equal to 10000"),
        ("ACCOUNT_QUEUE_SECONDS", "-1", "greater than or equal to 0"),
        ("ACCOUNT_QUEUE_SECONDS", "61", "less than or equal to 60"),
        ("ACCOUNT_QUEUE_SECONDS", "nan", "finite number"),
    ],
)
def test_account_bounds_out_of_range_are_refused(monkeypatch, name, value, told):
    monkeypatch.setenv(f"ENGRAM_{name}", value)
    with pytest.raises(ValueError) as refused:
        Settings()
    assert told in str(refused.value)


SECRETS = {
    "ENGRAM_DATABASE_URL": "postgresql://engram:S3CRET-9@db:5432/engram",
    "ENGRAM_BOOTSTRAP_TOKEN": "S3CRET-9" * 4,
    "ENGRAM_EMBEDDING_API_KEY": "sk-S3CRET-9",
    "ENGRAM_MODEL_API_KEY": "sk-S3CRET-9 ",
}


def test_every_secret_setting_may_be_read_from_a_file(monkeypatch, tmp_path):
    """ENGRAM_<NAME>_FILE, as Docker and Kubernetes mount secrets: the file's text less the
    newline that ends it (a variable's value shows in `docker inspect`)."""
    secrets = {
        f"ENGRAM_{name.upper()}"
        for name, field in Settings.model_fields.items()
        if SecretStr in get_args(field.annotation)
    }
    assert secrets == set(SECRETS), "give each secret setting a value in SECRETS, above"
    for index, (name, value) in enumerate(SECRETS.items()):
        path = tmp_path / f"secret-{index}"
        path.write_bytes(f"{value}\r\n\n".encode() if index % 2 else f"{value}\n".encode())
        monkeypatch.setenv(f"{name}_FILE", str(path))
    settings = Settings()
    assert settings.database_url_value() == SECRETS["ENGRAM_DATABASE_URL"]
    assert settings.bootstrap_token_value() == SECRETS["ENGRAM_BOOTSTRAP_TOKEN"]
    assert settings.embedding_api_key is not None and settings.model_api_key is not None
    assert settings.embedding_api_key.get_secret_value() == SECRETS["ENGRAM_EMBEDDING_API_KEY"]
    # Only the newline is the file's: other whitespace is the value's, as it is a variable's.
    assert settings.model_api_key.get_secret_value() == SECRETS["ENGRAM_MODEL_API_KEY"]
    # An empty variable counts as unset, as the settings' own do; other settings have no file.
    monkeypatch.setenv("ENGRAM_MODEL_API_KEY_FILE", "")
    monkeypatch.setenv("ENGRAM_PORT_FILE", str(tmp_path / "secret-0"))
    settings = Settings()
    assert settings.model_api_key is None and settings.port == 8000


def test_a_secret_files_byte_order_mark_is_no_part_of_its_value(monkeypatch, tmp_path):
    """As a Windows editor saves text: the token was the mark and the token, which no client
    sends (and a key with it, no header could carry)."""
    path = tmp_path / "token"
    path.write_bytes(b"\xef\xbb\xbf" + SECRETS["ENGRAM_BOOTSTRAP_TOKEN"].encode() + b"\r\n")
    monkeypatch.setenv("ENGRAM_BOOTSTRAP_TOKEN_FILE", str(path))
    assert Settings().bootstrap_token_value() == SECRETS["ENGRAM_BOOTSTRAP_TOKEN"]


def _refusal() -> str:
    with pytest.raises(ValueError) as refused:
        Settings()
    assert "S3CRET-9" not in str(refused.value)
    return str(refused.value)


def test_a_secret_set_both_ways_is_refused(monkeypatch, tmp_path):
    (tmp_path / "token").write_text(SECRETS["ENGRAM_BOOTSTRAP_TOKEN"])
    monkeypatch.setenv("ENGRAM_BOOTSTRAP_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("ENGRAM_BOOTSTRAP_TOKEN", SECRETS["ENGRAM_BOOTSTRAP_TOKEN"])
    assert (
        "ENGRAM_BOOTSTRAP_TOKEN and ENGRAM_BOOTSTRAP_TOKEN_FILE are both set: set one or the other"
    ) in _refusal()


@pytest.mark.parametrize(
    ("content", "told"),
    [
        (None, "cannot be read: No such file or directory"),
        ("folder", "cannot be read: Is a directory"),
        (b"", "is empty"),
        (b"\n", "is empty"),
        (b"S3CRET-9\xff\xfe", "is not UTF-8 text"),
        (b"S3CRET-9" * 8193, "holds more than 65,536 bytes"),
    ],
    ids=["missing", "folder", "empty", "newline", "not-utf8", "too-large"],
)
def test_a_secret_file_that_holds_no_value_is_refused_naming_it(
    monkeypatch, tmp_path, content, told
):
    path = tmp_path / "secret"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    monkeypatch.setenv("ENGRAM_MODEL_API_KEY_FILE", str(path))
    said = _refusal()
    assert said.startswith(f"ENGRAM_MODEL_API_KEY_FILE ({path}) {told}"), said


def test_a_secret_setting_may_be_a_pipe_read_once_at_start(monkeypatch):
    """Unlike a model key's file, read at each call (test_runtime_model.py), a setting's file
    is read once, before the service serves: a pipe serves, as `<(pass show engram/token)`
    gives one (/dev/fd/N)."""
    read, write = os.pipe()
    os.write(write, SECRETS["ENGRAM_BOOTSTRAP_TOKEN"].encode() + b"\n")
    os.close(write)
    try:
        monkeypatch.setenv("ENGRAM_BOOTSTRAP_TOKEN_FILE", f"/dev/fd/{read}")
        assert Settings().bootstrap_token_value() == SECRETS["ENGRAM_BOOTSTRAP_TOKEN"]
    finally:
        os.close(read)


def test_a_short_token_from_a_file_is_refused_naming_the_file(monkeypatch, tmp_path):
    """Production's length check names the variable the token came from: the file's."""
    path = tmp_path / "token"
    path.write_text("S3CRET-9\n")
    monkeypatch.setenv("ENGRAM_ENVIRONMENT", "production")
    monkeypatch.setenv("ENGRAM_BOOTSTRAP_TOKEN_FILE", str(path))
    assert (
        f"ENGRAM_BOOTSTRAP_TOKEN_FILE ({path}) must be at least 32 characters in production"
    ) in _refusal()
