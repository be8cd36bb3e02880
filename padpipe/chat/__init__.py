"""The chat wing: a ``transformers`` tokenizer's chat template rendered as ``apply_chat_template`` renders it
(template), the stage's options (options), the columns of a conversation row read into Python values (rows),
each trained message's span in the rendered text (spans), the tokens with their character spans (encode) and
the labels cut to ``max_length`` (labels).

``.chat()`` (``padpipe/pipes/chat.py``) is its only user. Modules here carry plain names; the wing is
private as a whole (the public face is ``padpipe/__init__.py``).
"""
