"""Imported once by the forkserver of `qlint.run.isolation`: every child starts with the stack loaded."""

from qlint.graph import stack

stack.load()
