"""The runtime wing: what turns a recipe into the graphs each consumer runs, and resumes them.

Modules here carry plain names; the wing is private as a whole (the public face is
``padpipe/__init__.py``).
"""
