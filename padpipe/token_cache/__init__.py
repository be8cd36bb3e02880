"""The token cache wing: a recipe's cache (plan) and a built pipeline's session of it (session), the reader's walk
over its segments (walk), the rows it passes on (rows), filling it (fill; chat_rows for ``.chat()``), its files
(store), their checks (check) and the small states of buffered rows (state). ``pp.TokenCache`` and
``pp.cache.info`` / ``clear`` (padpipe/cache.py) are its public face; the wing is private as a whole.
"""
