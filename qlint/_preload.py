"""Imported once by the forkserver of `qlint.isolation`: every child starts with the stack loaded."""

from qlint import backend

backend.load()
