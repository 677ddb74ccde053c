"""Secret settings are recognised by what they are (:data:`lakecast.auth.SECRET_KEY`): a
test per known Hadoop, S3A, ABFS/WASB, GCS and Spark secret key, and settings that are
not secrets stay public. A secret kept in the server's Spark conf would be readable by
every client with ``spark.conf.get``."""

import pytest

from lakecast.auth import SECRET_KEY, split_secrets
from lakecast.errors import ConfigError

SECRETS = [
    # S3A
    "fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token",
    "fs.s3a.encryption.key", "fs.s3a.server-side-encryption.key",
    "fs.s3a.bucket.lake.secret.key", "fs.s3a.aws.credentials.provider",
    "fs.s3a.assumed.role.credentials.provider",
    # ABFS / WASB
    "fs.azure.account.key.acct.dfs.core.windows.net",
    "fs.azure.account.oauth2.client.secret", "fs.azure.account.oauth2.client.id",
    "fs.azure.sas.container.acct.blob.core.windows.net", "fs.azure.sas.fixed.token",
    "fs.azure.account.keyprovider.acct.dfs.core.windows.net",
    # GCS
    "fs.gs.auth.service.account.private.key", "fs.gs.auth.service.account.private.key.id",
    "google.cloud.auth.service.account.json.keyfile",
    # Hadoop and Spark
    "hadoop.security.credential.provider.path", "spark.ssl.keyStorePassword",
    "spark.ssl.keyPassword", "spark.ssl.trustStorePassword", "spark.authenticate.secret",
    "spark.connect.authenticate.token", "spark.io.encryption.key",
    "javax.jdo.option.ConnectionPassword", "spark.sql.catalog.x.client.api.key",
]
PUBLIC = [
    "spark.sql.shuffle.partitions", "spark.master", "fs.s3a.endpoint",
    "fs.s3a.path.style.access", "fs.s3a.impl", "spark.sql.extensions",
    "spark.databricks.delta.properties.defaults.enableChangeDataFeed",
    "spark.sql.catalog.spark_catalog", "spark.driver.memory", "fs.s3a.connection.maximum",
    "spark.sql.sources.partitionOverwriteMode", "spark.hadoop.fs.s3a.endpoint.region",
]


@pytest.mark.parametrize("key", SECRETS)
def test_a_known_secret_key_is_recognised(key: str) -> None:
    assert SECRET_KEY.search(key), key
    # as a Hadoop setting it goes to the server's private core-site.xml, never the conf
    public, hidden = split_secrets({f"spark.hadoop.{key}": "s3cr3t"})
    assert public == {} and hidden == {key: "s3cr3t"}


@pytest.mark.parametrize("key", [k for k in SECRETS if k.startswith("spark.")])
def test_a_secret_outside_hadoop_settings_is_refused_naming_the_fix(key: str) -> None:
    with pytest.raises(ConfigError, match="looks like a secret") as e:
        split_secrets({key: "s3cr3t"})
    assert "s3cr3t" not in str(e.value)


@pytest.mark.parametrize("key", PUBLIC)
def test_a_public_setting_stays_public(key: str) -> None:
    assert not SECRET_KEY.search(key), key
