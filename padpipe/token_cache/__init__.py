"""The token cache wing: the cache in a built pipeline (session), its reader-side walk (walk), the
rows it passes to ``tokenize`` (rows), filling it (fill), its files (store) and small states (state).

``pp.TokenCache`` and ``pp.cache.info`` / ``clear`` (padpipe/cache.py) are its public face.

Modules here carry plain names; the wing is private as a whole (the public face is
``padpipe/__init__.py``).
"""
