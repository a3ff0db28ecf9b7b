"""Small plugins written the way a third party would, for the plugin-loading tests.

They declare families and offer keyed components; none of them is the code under test.
"""

from __future__ import annotations

import attrs

from plugmq.core import Family, PluginDeclaration, hookimpl


@attrs.frozen
class ExampleOptions:
    flush: str = "async"
    segment_size: int = 1024


class Declares:
    def __init__(self, name: str, *families: Family, options: type | None = None) -> None:
        self.name = name
        self.families = families
        self.options = options

    @hookimpl
    def plugmq_declare(self) -> PluginDeclaration:
        return PluginDeclaration(name=self.name, families=set(self.families), options=self.options)


class OffersFilter(Declares):
    def __init__(self, name: str, expression_type: str) -> None:
        super().__init__(name, Family.FILTER)
        self.expression_type = expression_type

    @hookimpl
    def plugmq_filter_compilers(self) -> dict[str, object]:
        return {self.expression_type: object()}


class OffersStrategy(Declares):
    def __init__(self, name: str, strategy: str) -> None:
        super().__init__(name, Family.ALLOCATION)
        self.strategy = strategy

    @hookimpl
    def plugmq_allocate_strategies(self) -> dict[str, object]:
        return {self.strategy: object}


class MisspelledHook(Declares):
    @hookimpl
    def plugmq_make_stor(self, context: object) -> None:  # the typo is the point of the test
        return None


class WrongName(Declares):
    @hookimpl
    def plugmq_declare(self) -> PluginDeclaration:
        return PluginDeclaration(name="something-else", families={Family.EVENTS})
