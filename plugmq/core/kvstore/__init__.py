"""Building blocks for message stores on sorted key-value engines (store_lmdb, store_rocks).

The record/key codec and the leader/follower group commit live in the core so both engine
plugins share one copy without importing each other.
"""
