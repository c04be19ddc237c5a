"""Conformance suite: every registered encoding, parametrized over ``relpos.available()``."""
