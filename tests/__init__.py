"""plugmq's own tests: a package, so fixture plugins and helpers import as ``tests.fixtures.*`` and
``tests.helpers.*`` and mypy sees one module name per file."""

import pytest

# The helpers assert too: pytest rewrites their asserts as a test's (it must know before they load).
pytest.register_assert_rewrite("tests.helpers")
