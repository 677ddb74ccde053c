"""Typed, canonical JSON for state values: data in, data out — never code.

What checkpoints and keyed state rows store instead of pickles. :func:`dumps` is
canonical (equal values give equal bytes: mappings sorted by key, sets sorted);
:func:`loads` builds only builtins, ``datetime`` and ``Decimal`` values and raises
:class:`ValueError` on anything else.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import json
from collections.abc import Mapping
from typing import Any


def encode_value(value: Any) -> Any:
    """A canonical, JSON-able form of a state key or value: JSON scalars as they are,
    every other type as a one-key object naming it (``{"d": [[k, v], ...]}`` for a
    mapping, sorted by key; ``{"l": [...]}``, ``{"t": [...]}``, ``{"s": [...]}`` sorted,
    ``{"b": base64}``, ``{"dt"|"date"|"time": iso}``, ``{"td": [days, s, us]}``,
    ``{"dec": text}``). Raises :class:`TypeError` for other objects."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, Mapping):
        items = [(encode_value(k), encode_value(v)) for k, v in value.items()]
        return {"d": [list(kv) for kv in sorted(items, key=lambda kv: _canon(kv[0]))]}
    if isinstance(value, set | frozenset):
        return {"s": sorted((encode_value(v) for v in value), key=_canon)}
    if isinstance(value, tuple) and not hasattr(value, "append"):
        return {"t": [encode_value(v) for v in value]}
    if isinstance(value, list | tuple):  # lists and FrozenLists
        return {"l": [encode_value(v) for v in value]}
    if isinstance(value, bytes | bytearray):
        return {"b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dt.datetime):
        return {"dt": value.isoformat()}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"time": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"td": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, decimal.Decimal):
        return {"dec": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return encode_value({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and type(value).__module__ == "numpy":
        return encode_value(item())
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__} value")


#: ``json.dumps(..., sort_keys=True, separators=(",", ":"))`` without building an encoder
#: per call (that was most of the cost of sorting a mapping's keys)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def _canon(encoded: Any) -> str:
    return _CANONICAL.encode(encoded)


_DECODERS: dict[str, Any] = {
    "l": lambda b: [decode_value(v) for v in _list(b)],
    "t": lambda b: tuple(decode_value(v) for v in _list(b)),
    "s": lambda b: frozenset(decode_value(v) for v in _list(b)),
    "d": lambda b: {decode_value(_pair(kv)[0]): decode_value(_pair(kv)[1]) for kv in _list(b)},
    "b": lambda b: base64.b64decode(_str(b), validate=True),
    "dt": lambda b: dt.datetime.fromisoformat(_str(b)),
    "date": lambda b: dt.date.fromisoformat(_str(b)),
    "time": lambda b: dt.time.fromisoformat(_str(b)),
    "td": lambda b: dt.timedelta(*[int(x) for x in _list(b)]),
    "dec": lambda b: decimal.Decimal(_str(b)),
}


def _list(body: Any) -> list[Any]:
    if not isinstance(body, list):
        raise ValueError(f"expected a JSON array, got {type(body).__name__}")
    return body


def _pair(body: Any) -> list[Any]:
    if not isinstance(body, list) or len(body) != 2:
        raise ValueError("expected a [key, value] pair")
    return body


def _str(body: Any) -> str:
    if not isinstance(body, str):
        raise ValueError(f"expected a JSON string, got {type(body).__name__}")
    return body


def decode_value(value: Any) -> Any:
    """The value :func:`encode_value` encoded (builtins, datetime and Decimal only);
    raises :class:`ValueError` on anything else."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((tag, body),) = value.items()
        decoder = _DECODERS.get(tag)
        if decoder is not None:
            return decoder(body)
    if isinstance(value, list):
        raise ValueError("an untagged JSON array")
    raise ValueError(f"an unknown JSON object {str(value)[:60]}")


def dumps(value: Any) -> bytes:
    """Canonical typed JSON bytes of ``value`` (:class:`TypeError` for other objects)."""
    return _canon(encode_value(value)).encode()


def loads(data: bytes) -> Any:
    """The value of :func:`dumps`; :class:`ValueError` when ``data`` is not typed JSON."""
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 JSON ({e})") from None
    return decode_value(obj)
