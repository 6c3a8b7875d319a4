"""Backends: one package each (`cpu`, ...), each subclassing `Buffer` and `Backend`."""
