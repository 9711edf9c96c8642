"""The pure core: options, dispatch policies, backoff and the Node Driver.

Nothing in this package imports Django, a database driver, ``threading``, ``time`` or
``random``: time arrives inside events and randomness is passed in. ``tests/core`` proves it.
"""
