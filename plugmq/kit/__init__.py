"""Code several plugins share, outside the SPI: plugins may import it, the runtime need not.

``kvstore`` (a MessageStore over any ordered key-value engine: store_lmdb, store_rocks),
``requestcodec`` (delay plugins' bulk decoder of stored append requests), ``writeback`` (a delay
plugin's delivery of due messages), ``lateness`` (the lateness histogram of delay plugins' metrics),
``diskspace`` (disk-full errors as every store reports them), ``fdlimit`` (the open-file budget and
its errors), ``options`` (option validators and defaults plugins' option classes share). The kit
imports ``plugmq.core`` only.
"""
