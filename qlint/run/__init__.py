"""Running qlint over many inputs: the engine (artifacts and targets, lint or fix each), child
processes that turn a crash, hang or memory blow-up into one error line, the on-disk cache that
answers unchanged inputs without torch, and the import tracking that keys it."""
