"""Clients of a broker: producers, push / pull / simple consumers, the transaction producer.

Each is written against a small port (``ports``): the broker builds a client and hands itself over
as the port it needs, so clients never import the runtime's modules (an import-linter contract
keeps it so). ``values`` holds what clients receive beyond the SPI's message values.
"""
