"""Which settings hold a secret (:data:`SECRET_KEY`), and showing a setting without its
secret (:func:`shown`): used where settings are read (:mod:`lakecast.config`) and kept off
sessions (:mod:`lakecast.auth`)."""

from __future__ import annotations

import re

#: a setting that holds a secret, recognised by what it is: what Spark itself redacts
#: (``spark.redaction.regex``: secret, password, token, access key), credentials and their
#: providers (``fs.s3a.aws.credentials.provider``, ``hadoop.security.credential.provider.
#: path``), keys of any kind (``fs.s3a.encryption.key``, ``fs.azure.account.key.<acct>``,
#: a private key, a name ending in ``.key``), SAS and OAuth client secrets, passphrases
SECRET_KEY = re.compile(
    r"(?i)secret|passw(or)?d|passphrase|token|credential|signature|key[._-]?file|"
    r"(access|account|private|encryption|client|api|master|storage|sas)[._-]?key|"
    r"(^|[._-])(key|sas)([._-]|$)|\.sas\.|oauth2?[._-]client")


def shown(entry: str) -> str:
    """``entry`` (a ``key=value`` line or pair) as an error message may show it: whole,
    unless it looks like a secret; then only its key, up to the first ``=``, ``:`` or
    space (the value never)."""
    if not SECRET_KEY.search(entry):
        return repr(entry)
    key = re.split(r"[=:\s]", entry.strip(), maxsplit=1)[0]
    return f"{key!r} (a secret setting: its value is not shown)"
