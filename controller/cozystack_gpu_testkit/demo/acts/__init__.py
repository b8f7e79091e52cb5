"""The demo's acts, one module each, in the order :mod:`..story` plays them.

Each act is a function of the :class:`~.common.Demo` it reads from and hands on; what more than
one act shares (the Demo, the story's names, the reads the checks use) is in :mod:`.common`.
Acts import :mod:`.common`, never one another.
"""
