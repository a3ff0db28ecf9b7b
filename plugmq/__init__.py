"""plugmq: a message-queue broker framework built from pluggy plugins."""
