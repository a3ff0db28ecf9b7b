"""Reading back what a test stored: a message the test knows is there, or the test fails saying so."""

from __future__ import annotations

from plugmq.core import MessageStore, StoredMessage

__all__ = ["stored_at"]


def stored_at(store: MessageStore, commit_log_offset: int) -> StoredMessage:
    """The message at ``commit_log_offset`` (the test stored one there)."""
    message = store.read(commit_log_offset)
    assert message is not None, f"nothing stored at commit log offset {commit_log_offset}"
    return message
