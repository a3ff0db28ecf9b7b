"""Building blocks for message stores on sorted key-value engines (store_lmdb, store_rocks).

The record/key codec, the leader/follower group commit and the engine-independent half of the
store (``base.KeyValueMessageStore``: queue state, reads, retention, tail cut, open/close) live
in the core so both engine plugins share one copy without importing each other.
"""
