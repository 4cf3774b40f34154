"""The static tier (`qlint check --static`): QL001 and QL004 read from a `.pt2`'s graph JSON and
proven with float32 arithmetic emulated bit for bit, never importing torch, so a pre-commit hook
answers in a fraction of a second."""
