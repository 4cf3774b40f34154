"""Imported once by the forkserver of `qlint.run.isolation`: every child starts with the stack loaded
(and frozen out of the garbage collector's generations, `qlint.run.collector`).

torch.fx's interpreter makes a (disabled) tqdm progress bar in every export, and tqdm creates a
multiprocessing lock on first use. Made in a child, which ends with `os._exit`, that lock's
semaphore is never released, and the resource tracker warns about it on qlint's stderr at exit.
A thread lock set here, before any child is forked, is the one every child's tqdm takes instead:
no child prints a progress bar another could interleave with.
"""

import threading

from qlint.loading import stack
from qlint.run import collector

collector.own_the_process()
stack.load()
collector.freeze_the_stack()

try:
    from tqdm import tqdm
except ImportError:  # torch.hub's own stand-in makes no lock
    pass
else:
    tqdm.set_lock(threading.RLock())
