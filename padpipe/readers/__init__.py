"""The readers wing: one reader per source (parquet, arrow, jsonl, hf, iterable) on one base (source),
and the file machinery they share (file_source, listing, paths, retry, schema, jsonl_blocks, aligned).

Modules here carry plain names; the wing is private as a whole (the public face is
``padpipe/__init__.py``).
"""
