"""The server's token, client connection strings and secret confs (no Spark here; the
server's own tests are ``test_server.py``)."""

from __future__ import annotations

import stat
import threading

import pytest

from lakecast import auth
from lakecast.config import get_settings
from lakecast.errors import ConfigError


def _settings(tmp_path, **env: str):
    return get_settings({"LAKECAST_HOME": str(tmp_path), **env})


def test_the_token_is_generated_once_for_the_owner_only(tmp_path):
    settings = _settings(tmp_path)
    assert auth.read_token(settings) is None
    with pytest.raises(auth.AuthError, match="lakecast server start"):
        auth.client_token(settings, "sc://127.0.0.1:1")
    tokens: list[str] = []
    threads = [threading.Thread(target=lambda: tokens.append(auth.ensure_token(settings)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    path = auth.token_file(settings)
    assert len(set(tokens)) == 1 and path.read_text().strip() == tokens[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert auth.client_token(settings, "sc://127.0.0.1:1") == tokens[0]
    assert tokens[0] not in repr(_settings(tmp_path, LAKECAST_SERVER_TOKEN=tokens[0]))


def test_the_operator_token_wins_and_bad_tokens_name_the_fix(tmp_path):
    own = tmp_path / "token"
    own.write_text("operator-file-token-0123456789\n")
    own.chmod(0o644)
    settings = _settings(tmp_path, LAKECAST_SERVER_TOKEN_FILE=str(own))
    assert auth.operator_token(settings)
    with pytest.raises(auth.AuthError, match=f"chmod 600 {own}"):
        auth.read_token(settings)
    own.chmod(0o600)
    assert auth.ensure_token(settings) == "operator-file-token-0123456789"
    env_token = _settings(tmp_path, LAKECAST_SERVER_TOKEN="operator-env-token-0123456789",
                          LAKECAST_SERVER_TOKEN_FILE=str(own))
    assert auth.read_token(env_token) == "operator-env-token-0123456789"
    for bad in ("short", "has;semicolon-0123456789", "has space 0123456789"):
        with pytest.raises(auth.AuthError, match="LAKECAST_SERVER_TOKEN is not usable"):
            auth.read_token(_settings(tmp_path, LAKECAST_SERVER_TOKEN=bad))
    missing = _settings(tmp_path, LAKECAST_SERVER_TOKEN_FILE=str(tmp_path / "none"))
    with pytest.raises(auth.AuthError, match="does not exist"):
        auth.read_token(missing)


def test_connection_strings_send_the_token_only_where_it_stays_private():
    token, sid = "t" * 32, "0b4e7a0c-5c2b-4b8e-9a55-0c1f6a8d2e11"
    tail = f";token={token};session_id={sid}"
    assert auth.connection_string("sc://127.0.0.1:15002", token, sid) == (
        "sc://localhost:15002/" + tail)  # gRPC local credentials: loopback, no TLS
    assert auth.connection_string("sc://[::1]:7", token, sid) == "sc://localhost:7/" + tail
    assert auth.connection_string("sc://spark.example:443/;use_ssl=true", token, sid) == (
        "sc://spark.example:443/;use_ssl=true" + tail)
    with pytest.raises(ConfigError, match=r"only over TLS.*use_ssl=true"):
        auth.connection_string("sc://10.1.2.3:15002", token, sid)
    with pytest.raises(ConfigError, match="leave token= and session_id= out"):
        auth.connection_string("sc://localhost:15002/;token=abc", token, sid)


def test_secret_hadoop_settings_leave_the_spark_conf():
    conf = {"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
            "spark.hadoop.fs.s3a.access.key": "ak", "spark.hadoop.fs.s3a.secret.key": "sk",
            "spark.hadoop.fs.s3a.session.token": "st", "spark.sql.shuffle.partitions": "8"}
    public, hidden = auth.split_secrets(conf)
    assert public == {"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
                      "spark.sql.shuffle.partitions": "8"}
    assert hidden == {"fs.s3a.access.key": "ak", "fs.s3a.secret.key": "sk",
                      "fs.s3a.session.token": "st"}
    for key in ("spark.connect.authenticate.token", "spark.executorEnv.AWS_SECRET_ACCESS_KEY"):
        with pytest.raises(ConfigError, match=f"{key} looks like a secret"):
            auth.split_secrets({key: "x"})


def test_server_settings_come_from_config_with_their_defaults(tmp_path):
    s = _settings(tmp_path)
    assert (s.server_host, s.server_port, s.cluster_port) == ("127.0.0.1", 15002, 7077)
    assert s.server_token is None and s.pipelines_module is None and s.crash_at == ""
    s = _settings(tmp_path, LAKECAST_SERVER_HOST="0.0.0.0", LAKECAST_SERVER_PORT="16000",
                  LAKECAST_CLUSTER_PORT="8000", LAKECAST_PIPELINES="my.pipes",
                  LAKECAST_CRASH_AT="read:2")
    assert (s.server_host, s.server_port, s.cluster_port) == ("0.0.0.0", 16000, 8000)
    assert (s.pipelines_module, s.crash_at) == ("my.pipes", "read:2")
    for var in ("LAKECAST_SERVER_PORT", "LAKECAST_CLUSTER_PORT"):
        with pytest.raises(ConfigError, match=f"{var}='http': use a TCP port number"):
            _settings(tmp_path, **{var: "http"})
