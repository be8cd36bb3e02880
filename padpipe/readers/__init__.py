"""The readers wing: one format per source (parquet, arrow, jsonl, csv, hf) written to one small protocol
(format), read by one node (source) that holds the parts every reader shares: the elastic planner (plan),
the listing identity (identity, listing_state), and for files the file access (files) and the node around it
(file_source, with listing, paths, retry, schema, jsonl_blocks, aligned). ``iterable`` and streaming
``IterableDataset`` readers have no units and are nodes of their own. The wing is private as a whole.
"""
