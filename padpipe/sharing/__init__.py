"""Who reads what: this process's rank and reader slot, the shares of an epoch, and values gathered over ranks.

The ground the readers stand on: :mod:`~padpipe.sharing.consumer` (a reader's slot),
:mod:`~padpipe.sharing.shares` (equal stretches of work units), :mod:`~padpipe.sharing.ranks`
(ranks of a process group, and gathering over it).
"""
