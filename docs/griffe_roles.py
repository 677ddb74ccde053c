"""A Griffe extension for the docs site: the code base's docstrings use reST roles
(``:class:`~pkg.Name```, ``:func:`f```); the site shows them as Markdown inline code."""

from __future__ import annotations

import re
from typing import Any

import griffe

#: a reST role such as :class:`~lakecast.api.Lookup` or :mod:`lakecast.config`
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|ref):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    """``text`` with every reST role as inline code (``~`` keeps the last name only)."""
    return ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


class ReSTRoles(griffe.Extension):
    """Rewrite reST roles in every docstring as Markdown inline code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
