"""CHECK conditions in few expression nodes.

PostgreSQL reads every CHECK of a table back from its stored node text and prepares it in every
statement that writes a row of that table (``ExecConstraints``: ``stringToNode``, then
``ExecPrepareExpr``), so a long condition costs each insert and update. Django writes
``column IN (...)`` as an array of casts, one per value; one array constant says the same in a
fraction of the nodes (issue 12: the todo and attempt tables; issue 13: the ledger's rows, two
of which every named claim cycle writes).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models import F, Func

# What an array constant's element may be, unquoted and unescaped.
_BARE_ELEMENT = re.compile(r"[A-Za-z0-9_.:-]+")


class CheckSQL(Func):
    """A CHECK condition written as SQL over the row's columns: ``template`` with ``{0}``,
    ``{1}``, ... for ``columns`` (see queues' Todo.Meta). Unlike RawSQL, the columns are
    expressions, so Django's model validation still evaluates it (with the instance's values in
    their place)."""

    output_field = models.BooleanField()

    def __init__(self, template: str, *columns: str) -> None:
        super().__init__(*(F(column) for column in columns))
        self.sql_template = template

    def as_sql(
        self,
        compiler: Any,
        connection: Any,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> Any:
        compiled = [compiler.compile(e) for e in self.get_source_expressions()]
        # A column named twice binds its parameters twice (model validation puts a value
        # there), in the order the placeholders appear.
        params: list[Any] = []
        for _literal, field, _spec, _conversion in string.Formatter().parse(self.sql_template):
            if field is not None:
                params.extend(compiled[int(field)][1])
        return self.sql_template.format(*(sql for sql, _ in compiled)), params

    def deconstruct(self) -> Any:
        path, _args, _kwargs = super().deconstruct()
        columns = [e.name for e in self.get_source_expressions()]
        return path, (self.sql_template, *columns), {}


def one_of(column: str, values: type[models.TextChoices] | Iterable[str]) -> CheckSQL:
    """``column`` is one of ``values`` (a NULL passes, as with IN), as one array constant."""
    listed = list(values.values if isinstance(values, type) else values)
    for value in listed:
        if not _BARE_ELEMENT.fullmatch(value) or value.upper() == "NULL":
            raise ValueError(f"{value!r} cannot be written unquoted in an array constant")
    return CheckSQL(f"{{0}}::text = ANY ('{{{{{','.join(listed)}}}}}'::text[])", column)
